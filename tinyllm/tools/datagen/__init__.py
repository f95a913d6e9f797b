"""Teacher-written training conversations (issue 14; docs/DATA.md): `tinyllm datagen`.

  tasks.json    the topic and task lists, system prompts, follow-ups, shares (data, not code)
  plan.py       a round's seeded picks from them; cleaning what the teacher writes
  teacher.py    the teacher model behind a batch-sampling `Engine` (64 requests at once)
  rounds.py     one round: written first turns -> filters -> answers -> follow-ups
  dedup.py      exact/near duplicates (MinHash) and leaks into held-out prompts
  shards.py     round files and the <= 15 MiB xz shards `tinyllm.tools.data` reads
  __main__.py   the command: rounds until a token target or a time budget, resumable
"""
