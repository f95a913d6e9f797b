"""One round of generation: plan -> the teacher writes first turns -> filter -> answers ->
filter -> follow-up turns -> conversations.

Contract:
- `Filters(leak, questions)`: the state kept across rounds: a `LeakFilter` over held-out
  prompts, a `NearDup` over first user turns and an exact set over answers. `remember(conv)`
  adds a kept conversation (how a resumed run rebuilds them from its round files).
- `judge_user(text, filters)` / `judge_answer(reply, user, expect, system_check)`: None when
  the turn is kept, else the reason it is dropped (counted per reason in the round's stats):
    user turn: "language", "loop", "leak", "dup_question"
    answer:    "truncated" (no stop token), "empty", "loop", "language", "identity" (names
               the teacher, SmolLM / Hugging Face), "echo" (repeats the question),
               "wrong_math" (a known answer missed), "system_ignored" (a stored system
               prompt's check failed), "dup_answer"
- `round_steps(tasks, filters, seed, r, n, count)`: round r as a generator of `Ask`s (the
  teacher calls it waits on, one at a time), sent each call's replies, returning
  (conversations, stats); `run_round(teacher, tasks, filters, seed, r, n) -> (conversations,
  stats)` answers its Asks with teacher.chat in turn (tinyllm.tools.datagen.stream runs
  several rounds' Asks through one engine side by side). Deterministic for a seed, a round
  index, the filters' state and a teacher on one device. Each conversation is
  {"messages": [system?, user, assistant, (user, assistant)...], "src": ..., "round": r};
  the system message is stored only when it is one of tasks["system_prompts"] (others
  are answered under tasks["hidden_system"], which is not stored). stats counts first turns
  planned and kept, drops by reason, turns, teacher tokens of the kept conversations.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, replace

from tinyllm.decode.sampling import SamplingParams
from tinyllm.text.textcheck import check_reply, has_loop, is_english, normalize
from tinyllm.tools.datagen.dedup import LeakFilter, NearDup
from tinyllm.tools.datagen.plan import Item, expand, pick_system, plan_round, round_rng

# The teacher writes prompts hot and answers as the tinychat-distill answers were made.
WRITE = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, repeat_penalty=1.1, max_tokens=120)
ANSWER = SamplingParams(temperature=0.5, top_k=50, top_p=0.9, repeat_penalty=1.1, max_tokens=384)
TEACHER_NAMES = ("smollm", "hugging face", "huggingface")


def stage_seed(seed: int, r: int, stage: str) -> int:
    """The sampling seed of one teacher call: a hash of the run's seed, the round and the stage."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{r}:{stage}".encode(), digest_size=8).digest(), "little") >> 1


class Filters:
    def __init__(self, leak: LeakFilter, questions: NearDup | None = None):
        self.leak = leak
        self.questions = questions or NearDup(0.7)
        self.answers: set[str] = set()

    def remember(self, conv: dict) -> None:
        users = [m["content"] for m in conv["messages"] if m["role"] == "user"]
        self.questions.add(users[0])
        self.answers.update(normalize(m["content"]) for m in conv["messages"] if m["role"] == "assistant")


def judge_user(text: str, filters: Filters, dedup: bool = True) -> str | None:
    if not is_english(text):
        return "language"
    if has_loop(text):
        return "loop"
    if filters.leak.leaks(text) is not None:
        return "leak"
    if dedup and not filters.questions.add(text):
        return "dup_question"
    return None


def judge_answer(text: str, finished: bool, user: str, expect: float | None = None,
                 system_check: dict | None = None) -> str | None:
    if not finished:
        return "truncated"
    if len(text.strip()) < 2:
        return "empty"
    if has_loop(text):
        return "loop"
    if not is_english(text):
        return "language"
    low = text.lower()
    if any(n in low for n in TEACHER_NAMES):
        return "identity"
    if normalize(text) == normalize(user):
        return "echo"
    if expect is not None and not check_reply(text, {"number": expect}, user):
        return "wrong_math"
    if system_check and not check_reply(text, system_check, user):
        return "system_ignored"
    return None


def _context(tasks: dict, conv: list[dict]) -> list[dict]:
    """What the teacher sees: the stored system prompt, else the hidden one."""
    if conv and conv[0]["role"] == "system":
        return conv
    return [{"role": "system", "content": tasks["hidden_system"]}] + conv


@dataclass
class Ask:
    """One teacher call a round waits on: jobs (message lists), their sampling and seed, and
    the text that starts each reply (or None)."""
    jobs: list[list[dict]]
    params: SamplingParams
    seed: int
    prefills: list[str] | None = None


def run_round(teacher, tasks: dict, filters: Filters, seed: int, r: int, n: int,
              max_tokens: int | None = None) -> tuple[list[dict], dict]:
    """See the module docstring: `round_steps` with each Ask answered by teacher.chat in turn."""
    steps = round_steps(tasks, filters, seed, r, n, teacher.count, max_tokens)
    replies = None
    while True:
        try:
            ask = steps.send(replies)
        except StopIteration as done:
            return done.value
        replies = teacher.chat(ask.jobs, ask.params, ask.seed, ask.prefills)


def round_steps(tasks: dict, filters: Filters, seed: int, r: int, n: int, count, max_tokens: int | None = None
                ) -> Generator[Ask, list, tuple[list[dict], dict]]:
    """Round r as a generator: it yields each Ask and is sent the replies (a list of Reply, in
    order); it returns (conversations, stats). `count(text)` counts teacher tokens. Driven by
    run_round (one call at a time) or tinyllm.tools.datagen.stream (rounds side by side)."""
    write, answer = WRITE, ANSWER
    if max_tokens:
        write = replace(WRITE, max_tokens=min(WRITE.max_tokens, max_tokens))
        answer = replace(ANSWER, max_tokens=min(ANSWER.max_tokens, max_tokens))
    stats: Counter = Counter()
    items, metas = plan_round(tasks, seed, r, n)
    # 1. the teacher writes first turns
    replies = yield Ask([[{"role": "user", "content": m.prompt}] for m in metas], write,
                        stage_seed(seed, r, "write"), [m.prefill for m in metas])
    for meta, rep in zip(metas, replies, strict=True):
        items += expand(meta, rep.text, rep.finished)
    stats["planned"] = n
    rng = round_rng(seed, r, "turns")
    kept: list[Item] = []
    for it in items:
        why = judge_user(it.user, filters)
        if why:
            stats[f"drop.{why}"] += 1
            continue
        it.system = pick_system(tasks, rng)
        kept.append(it)
    # 2. answers
    convs = [([{"role": "system", "content": it.system["text"]}] if it.system else [])
             + [{"role": "user", "content": it.user}] for it in kept]
    replies = yield Ask([_context(tasks, c) for c in convs], answer, stage_seed(seed, r, "answer"))
    done: list[tuple[Item, list[dict]]] = []
    for it, conv, rep in zip(kept, convs, replies, strict=True):
        if not _keep_answer(rep, it.user, it.expect, it.system and it.system["check"], filters, stats, "drop"):
            continue
        done.append((it, conv + [{"role": "assistant", "content": rep.text}]))
    # 3. follow-up turns: a share gets a second turn, a share of those a third
    share = tasks["followup_share"]
    for turn in (2, 3):
        pick = [(it, c) for it, c in done if sum(m["role"] == "user" for m in c) == turn - 1
                and rng.random() < share]
        share = tasks["third_turn_share"]
        yield from _follow_up(tasks, filters, pick, rng, stats, (write, stage_seed(seed, r, f"write{turn}")),
                              (answer, stage_seed(seed, r, f"answer{turn}")))
    out = []
    for it, conv in done:
        out.append({"messages": conv, "src": it.src, "round": r})
        stats["conversations"] += 1
        stats["turns"] += sum(m["role"] == "user" for m in conv)
        stats["tokens"] += sum(count(m["content"]) for m in conv)
    return out, dict(stats)


def _follow_up(tasks: dict, filters: Filters, pick: list, rng, stats: Counter,
               write: tuple[SamplingParams, int], answer: tuple[SamplingParams, int]) -> Generator[Ask, list, None]:
    """Append a user turn and its answer to each picked conversation (in place), or nothing."""
    if not pick:
        return
    by_teacher = [rng.random() < tasks["followup_teacher_share"] for _ in pick]
    metas = [[{"role": "user", "content": tasks["followup_meta"].format(q=c[-2]["content"], a=c[-1]["content"])}]
             for (_, c), t in zip(pick, by_teacher, strict=True) if t]
    written = iter((yield Ask(metas, *write)) if metas else [])
    asks: list[tuple[list[dict], str]] = []
    for (_, conv), t in zip(pick, by_teacher, strict=True):
        if t:
            rep = next(written)
            lines = [ln for ln in (x.strip() for x in rep.text.splitlines()) if ln]
            q = expand_line(lines[0]) if rep.finished and lines else ""
        else:
            q = rng.choice(tasks["followups"])
        why = "empty" if not q else judge_user(q, filters, dedup=False)
        if why:
            stats[f"drop.followup.{why}"] += 1
            continue
        asks.append((conv, q))
    if not asks:
        return
    replies = yield Ask([_context(tasks, c + [{"role": "user", "content": q}]) for c, q in asks], *answer)
    for (conv, q), rep in zip(asks, replies, strict=True):
        check = None
        if conv[0]["role"] == "system":
            check = next((s["check"] for s in tasks["system_prompts"] if s["text"] == conv[0]["content"]), None)
        if not _keep_answer(rep, q, None, check, filters, stats, "drop.followup"):
            continue
        conv += [{"role": "user", "content": q}, {"role": "assistant", "content": rep.text}]


def expand_line(line: str) -> str:
    """A teacher-written follow-up: its first line, cleaned, if it is a question of 2-30 words."""
    from tinyllm.tools.datagen.plan import clean_line

    q = clean_line(line)
    return q if q.endswith("?") and 2 <= len(q.split()) <= 30 else ""


def _keep_answer(rep, user: str, expect, check, filters: Filters, stats: Counter, drop: str) -> bool:
    """Whether a teacher's answer passes the judge and is not a duplicate; counts a drop under
    `drop`.<why>, and remembers a kept answer."""
    why = judge_answer(rep.text, rep.finished, user, expect, check)
    if why is None and normalize(rep.text) in filters.answers:
        why = "dup_answer"
    if why:
        stats[f"{drop}.{why}"] += 1
        return False
    filters.answers.add(normalize(rep.text))
    return True
