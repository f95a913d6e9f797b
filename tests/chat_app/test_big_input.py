"""A big paste (issue 52, defect 2): with 1 MB on one line in the input every key took 1.1-1.5 s.
A paste that would bring the input past PASTE_CHARS is an attachment chip ("pasted text ·
~N tokens") instead, sent fenced before the message; past MAX_BYTES it is refused in one line.
The input's TextArea stays small. Key latency is measured by scripts/big_input_keys.py
(docs/BENCHMARKS.md), not here: these tests wait on state, never on time. The last one sends
the paste through a real pseudo-terminal, as a terminal's bracketed paste."""

from __future__ import annotations

import sys

import pytest
from textual import events

from chat_app.attachments import MAX_BYTES, Attachment, compose
from chat_app.widgets import prompt_input
from chat_app.widgets.attachment_bar import AttachmentBar
from chat_app.widgets.prompt_input import PASTE_CHARS, PASTED
from tests.chat_app.conftest import loaded, notices, rows, send, wait_until

SIZE = (100, 30)
pytestmark = pytest.mark.anyio
MB = "lorem ipsum dolor sit amet, " * (1_000_000 // 28)  # 1 MB on one line


def chips(app) -> list[str]:
    return app.chat_screen.query_one(AttachmentBar).chips


async def paste(pilot, text: str) -> None:
    pilot.app.prompt.post_message(events.Paste(text))
    await pilot.pause()


async def test_a_1mb_paste_is_a_chip_and_the_input_stays_small(make_app, data_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.focus()
        await pilot.press("h", "i", "space")
        await paste(pilot, MB)
        assert app.prompt.text == "hi " and app.prompt.document.line_count == 1  # not in the TextArea
        assert chips(app) == [f"{PASTED} · ~{-(-len(MB) // 4):,} tokens"]
        await pilot.press("t", "h", "e", "r", "e")  # keys go on into the input
        assert app.prompt.text == "hi there"
        await paste(pilot, "x" * (PASTE_CHARS + 1))  # a second big paste: its own chip
        assert [c.split(" · ")[0] for c in chips(app)] == [PASTED, f"{PASTED} 2"]
        app.prompt.move_cursor((0, 0))
        await pilot.press("backspace")  # the last chip goes
        assert len(chips(app)) == 1 and app.prompt.text == "hi there"
        app.prompt.move_cursor(app.prompt.document.end)
        await pilot.press("enter")  # the tiny model's context is far smaller: refused, and back with its chip
        await wait_until(pilot, lambda: not app.busy and app.prompt.text and notices(app), what="the refusal")
        assert notices(app)[-1].startswith("message too long: ") and " over what the context holds" in notices(app)[-1]
        assert app.prompt.text == "hi there" and chips(app)[0].startswith(PASTED)
        assert not [r for r in rows(data_dir) if r[2] == "user"]  # the chat untouched


async def test_a_paste_that_fits_stays_text_and_one_past_it_becomes_a_chip(make_app, data_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.focus()
        small = "a line\r\nanother"
        await paste(pilot, small)
        assert app.prompt.text == "a line\nanother" and chips(app) == []
        await paste(pilot, "y" * (PASTE_CHARS - len(app.prompt.text)))  # up to the limit: still text
        assert len(app.prompt.text) == PASTE_CHARS and chips(app) == []
        app.prompt.load_text("Count the lines:")
        app.prompt.move_cursor(app.prompt.document.end)
        big = "\n".join(f"line {i}" for i in range(2000))  # many short lines: past it too
        await paste(pilot, big)
        assert app.prompt.text == "Count the lines:" and len(chips(app)) == 1

async def test_a_paste_past_the_limit_is_refused_in_one_line(make_app, data_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.focus()
        await paste(pilot, "z" * (MAX_BYTES + 1))
        said = notices(app)[-1]
        assert said.startswith("Paste refused: ") and "1 MiB" in said and "\n" not in said
        assert chips(app) == [] and app.prompt.text == "" and not rows(data_dir)
        app.prompt.attach([Attachment("a", "q" * (MAX_BYTES // 2))])
        await paste(pilot, "w" * (MAX_BYTES // 2 + 10))  # the two together are past it
        assert notices(app)[-1].startswith("Paste refused: ") and len(chips(app)) == 1


async def test_a_pasted_message_that_fits_is_sent_fenced(make_app, data_dir, monkeypatch):
    monkeypatch.setattr(prompt_input, "PASTE_CHARS", 200)  # the tiny model's context is 512 tokens
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.focus()
        pasted = "word " * 50  # 250 characters: a chip
        await paste(pilot, pasted)
        assert chips(app) and app.prompt.text == ""
        await send(pilot, "How many words?")
        sent = compose([Attachment(PASTED, pasted)], "How many words?")
        assert [r[3] for r in rows(data_dir) if r[2] == "user"] == [sent] and chips(app) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no pseudo-terminals")
def test_a_1mb_bracketed_paste_through_a_terminal(ckpt, tmp_path):
    from tests.chat_app.test_pty import start, typed

    term = start(ckpt, tmp_path)
    try:
        term.send("\x1b[200~" + MB + "\x1b[201~")
        term.wait(f"{PASTED} · ~{-(-len(MB) // 4):,} tokens", "the paste's chip")
        term.send("ok")
        typed(term, "ok")  # the input holds what was typed, not the paste
        assert term.exit_code(wait=False) is None
    finally:
        term.close()
