"""What one round of generation asks: seeded picks from the task lists in tasks.json.

Contract:
- `load_tasks(path=None) -> dict`: tasks.json beside this file (or another one of its shape).
- `plan_round(tasks, seed, round_index, n) -> (items, metas)`: a pure function of its
  arguments (a `random.Random` seeded by "seed:round"). `items` are first turns ready to
  answer (templates, arithmetic and word problems with their known answers, fixed small
  talk); `metas` are prompts that ask the teacher to WRITE first turns (n questions about a
  topic for a given asker, one sentence to rewrite, small-talk openers). Shares follow
  tasks["mix"]; n counts the first turns the round aims at (a meta asking for k lines
  counts k).
- `expand(meta, reply_text, complete=True) -> list[Item]`: the lines a meta's reply holds
  (all but the last when the reply was cut by the token limit; a numbered list
  on one line split too), cleaned (numbering, bullets, quotes and "Question:" labels
  stripped), as items; lines that do not look like what was asked (too short or long; where
  a question was asked: not a question, or one that does not name the topic, "How did it
  start?") dropped. The teacher (SmolLM2-135M) writes such lists only when its reply is
  started for it ("1.", Meta.prefill); asked plainly, it answers the topic instead.
- `pick_system(tasks, rng)`: a stored system prompt {"text", "check"} or None, at
  tasks["system_share"].
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

TASKS = Path(__file__).with_name("tasks.json")
LINES_PER_META = 5


@dataclass
class Item:
    src: str  # where the first turn came from: "q.<area>", "howto", "math.+", "wp.+", "rewrite", "chat", ...
    user: str  # the first user turn
    expect: float | None = None  # the known answer of arithmetic and word problems
    system: dict | None = None  # a stored system prompt {"text", "check"}


@dataclass
class Meta:
    src: str  # the src its items get
    prompt: str  # what the teacher is asked
    n: int  # lines asked for
    wrap: str | None = None  # "{s}" format for each line ("Rewrite ...: {s}")
    question: bool = False  # lines must be questions
    prefill: str = ""  # how the teacher's reply starts ("1." for a list)
    topic: str = ""  # a question must name it (one of its words), so it stands alone


def load_tasks(path: str | Path | None = None) -> dict:
    return json.loads(Path(path or TASKS).read_text())


def round_rng(seed: int, round_index: int, salt: str = "") -> random.Random:
    return random.Random(f"{seed}:{round_index}:{salt}")


def _arithmetic(t: dict, rng: random.Random) -> Item:
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        ans = a + b
    elif op == "-":
        a, b = sorted((rng.randint(2, 999), rng.randint(2, 999)), reverse=True)
        ans = a - b
    elif op == "*":
        a, b = rng.randint(2, 30), rng.randint(2, 20)
        ans = a * b
    else:
        b, ans = rng.randint(2, 12), rng.randint(2, 30)
        a = b * ans
    text = rng.choice(t["arithmetic"]["prompts"][op]).format(a=a, b=b)
    return Item(f"math.{op}", text, float(ans))


def _word_problem(t: dict, rng: random.Random) -> Item:
    wp = rng.choice(t["word_problems"])
    op = wp["op"]
    if op == "+":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        ans = a + b
    elif op == "-":
        a, b = sorted((rng.randint(3, 60), rng.randint(2, 59)), reverse=True)
        a += 1
        ans = a - b
    elif op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        ans = a * b
    else:
        b, ans = rng.randint(2, 8), rng.randint(2, 12)
        a = b * ans
    name, things = rng.choice(t["names"]), rng.choice(t["things"])
    return Item(f"wp.{op}", wp["t"].format(name=name, things=things, a=a, b=b), float(ans))


def _template(t: dict, rng: random.Random) -> Item:
    kind = rng.choice(sorted(t["templates"]))
    spec = t["templates"][kind]
    prompt = rng.choice(spec["prompts"])
    if "pairs" in spec:
        x, y = rng.choice(spec["pairs"])
        return Item(kind, prompt.format(x=x, y=y))
    if spec.get("from_topics"):
        area = rng.choice(sorted(t["topics"]))
        return Item(f"{kind}.{area}", prompt.format(x=rng.choice(t["topics"][area])))
    return Item(kind, prompt.format(x=rng.choice(spec["fill"])))


def plan_round(t: dict, seed: int, round_index: int, n: int) -> tuple[list[Item], list[Meta]]:
    rng = round_rng(seed, round_index, "plan")
    kinds = sorted(t["mix"])
    weights = [t["mix"][k] for k in kinds]
    items: list[Item] = []
    metas: list[Meta] = []
    planned = 0
    while planned < n:
        kind = rng.choices(kinds, weights)[0]
        if kind == "teacher_question":
            area = rng.choice(sorted(t["topics"]))
            topic, who = rng.choice(t["topics"][area]), rng.choice(t["question_writers"])
            prompt = t["question_meta"].format(n=LINES_PER_META, who=who, topic=topic)
            metas.append(Meta(f"q.{area}", prompt, LINES_PER_META, question=True, prefill=t["list_prefill"],
                              topic=topic))
            planned += LINES_PER_META
            continue
        if kind == "rewrite":
            area = rng.choice(sorted(t["topics"]))
            prompt = t["rewrite"]["meta"].format(topic=rng.choice(t["topics"][area]))
            metas.append(Meta("rewrite", prompt, 1, wrap=rng.choice(t["rewrite"]["prompts"])))
        elif kind == "smalltalk" and rng.random() < 0.5:
            prompt = t["smalltalk_meta"].format(n=LINES_PER_META, who=rng.choice(t["question_writers"]))
            metas.append(Meta("chat.teacher", prompt, LINES_PER_META, prefill=t["list_prefill"]))
            planned += LINES_PER_META
            continue
        elif kind == "smalltalk":
            items.append(Item("chat", rng.choice(t["smalltalk"])))
        elif kind == "arithmetic":
            items.append(_arithmetic(t, rng))
        elif kind == "word_problem":
            items.append(_word_problem(t, rng))
        else:
            items.append(_template(t, rng))
        planned += 1
    return items, metas


_LABEL = re.compile(r"^\s*(?:[-*•]|\d+[.):]|q\d*[.:]|question\s*\d*[.:]|sentence\s*\d*[.:])\s*", re.I)
_INLINE = re.compile(r"(?:^|\s)\d{1,2}[.)]\s+")  # "1. ... 2. ..." on one line
_ASKS = ("how", "what", "why", "when", "where", "who", "which", "is", "are", "do", "does", "did", "can",
         "could", "should", "would", "will", "whats", "what's", "how's")
_SMALL = frozenset("the a an of and or to in on for with about from by at its it their".split())


def clean_line(line: str) -> str:
    line = _LABEL.sub("", line.strip())
    line = line.strip().strip('"“”\'*').strip()
    return re.sub(r"\s+", " ", line)


def names_topic(text: str, topic: str) -> bool:
    """The text names the topic: one of its words of 3+ letters (their first 5 letters, so
    "volcanoes" matches "volcanic") appears."""
    stems = [w[:5] for w in re.findall(r"[a-z]+", topic.lower()) if len(w) >= 3 and w not in _SMALL]
    low = text.lower()
    return not stems or any(st in low for st in stems)


def _as_question(line: str, topic: str = "") -> str:
    """The line's question: the first of its "?"-ended sentences that names the topic (the
    teacher often explains after it), or the whole line with a "?" when it opens like a
    question and has none."""
    line = line.replace("**", "")
    if "?" in line:
        for part in re.findall(r"[^?]*\?", line):
            q = clean_line(re.split(r"(?<=[.!])\s+|[\"“”]\s*-?\s*", part.strip())[-1]) if part.strip() else ""
            if len(q.split()) >= 3 and names_topic(q, topic):
                return q
        return ""
    first = line.split()[0].lower() if line.split() else ""
    q = line.rstrip(".!") + "?"
    return q if first in _ASKS and names_topic(q, topic) else ""


def expand(meta: Meta, reply: str, complete: bool = True) -> list[Item]:
    lines = [x for part in reply.splitlines() for x in _INLINE.split(part)]
    if not complete and lines and not (meta.question and "?" in lines[-1]):
        lines = lines[:-1]  # cut by the token limit mid-line (a question before the cut stands)
    lines = [clean_line(x) for x in lines]
    if meta.question:
        lines = [_as_question(x, meta.topic) for x in lines]
    lines = [x for x in lines if 3 <= len(x.split()) <= 40]
    if meta.wrap is not None:  # one sentence asked: its first line
        lines = lines[:1]
    return [Item(meta.src, meta.wrap.format(s=x) if meta.wrap else x) for x in lines[:meta.n]]


def pick_system(t: dict, rng: random.Random) -> dict | None:
    if rng.random() >= t["system_share"]:
        return None
    return rng.choice(t["system_prompts"])
