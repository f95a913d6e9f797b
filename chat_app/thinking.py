"""Thinking: a reply's reasoning told apart from its answer, for the screen (chat_app.widgets.reply)
and the Markdown export (chat_app.history). Imports neither Textual nor torch.

Contract: `split_thought(text)` reads a reply as the model wrote it (what the store keeps) and
returns a `Thought`: the reasoning (None: the reply has none, or not yet), the answer, and whether
the block has closed. Two shapes are reasoning:
- a reply that opens with `<think>` (Qwen 3 with thinking on writes the tag itself): the text up
  to `</think>`, or all of it while the block is open. The start of an opening tag ("<thi") is
  neither reasoning nor answer yet.
- a reply that holds `</think>` without opening with `<think>` (DeepSeek-R1 and QwQ: their
  template's generation prompt opens the block, so the reply holds only its end): the text
  before the first `</think>`. Until that tag comes, such a reply reads as an answer.
A block that closes with nothing in it (the empty one some templates write when thinking is
off) is no reasoning. Other tag pairs ([THINK] ... [/THINK]) are not read: they stay answer text.

What is counted is words, not tokens (`count_words`): the tokenizer lives in the model process
(the UI never imports torch), a server sends text, not ids, and the store keeps text, so the
count is the same live, after a resume and in an export. A word is a run of non-space
characters, and each CJK character is one (text in those scripts has no spaces).

Whether the model sees the reasoning again is the chat template's business, not this module's:
Qwen 3's and DeepSeek-R1's templates send an earlier reply back from after its last `</think>`
(tinyllm.text.chat_template.ChatTemplate.visible).
"""

from __future__ import annotations

import re
from typing import NamedTuple

OPEN, CLOSE = "<think>", "</think>"
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")


class Thought(NamedTuple):
    text: str | None  # the reasoning (None: none, or not yet)
    answer: str  # what follows it ("" while the block is open)
    closed: bool  # its </think> has come


def split_thought(text: str) -> Thought:
    head = text.lstrip()
    if head.startswith(OPEN):
        thought, closed, answer = head[len(OPEN):].partition(CLOSE)
        return _thought(thought, answer, bool(closed))
    if head and OPEN.startswith(head):
        return Thought(None, "", False)  # maybe a tag: nothing shown yet
    if CLOSE in text:
        thought, _, answer = text.partition(CLOSE)
        return _thought(thought, answer, True)
    return Thought(None, text, False)


def _thought(thought: str, answer: str, closed: bool) -> Thought:
    thought = thought.strip("\n")
    if closed and not thought.strip():
        return Thought(None, answer.lstrip("\n"), True)  # an empty block: thinking was off
    return Thought(thought, answer.lstrip("\n") if closed else "", closed)


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def words(n: int) -> str:
    return f"{n:,} word" if n == 1 else f"{n:,} words"
