"""Our judge of answers (issue 14; docs/DATA.md): `tinyllm eval --model PATH`.

  prompts.jsonl / prompts.py   124 prompts written for this project, 112 with a checker
  __main__.py                  answers with the app's defaults, scores, the report
  heldout.py                   held-out loss as tinyllm.tools.train measures it, per token and byte
The checkers themselves are `tinyllm.text.textcheck.check_reply`, shared with the generator.
"""
