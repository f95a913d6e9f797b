"""Issue 43, the chat: a reply's <think> block shown apart from the answer as it streams (folded
to one line since issue 52: tests/chat_app/test_thinking_fold.py), the
thinking switch (F2, /set thinking on|off) through the template's enable_thinking, kept with the
chat, on the status bar; the model family on the status bar and in F1's title. Waits on state."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App

import chat_app
from chat_app.__main__ import build_app, build_parser
from chat_app.app import ChatApp
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, wait_until
from tests.tinyllm.test_chat_thinking import QWEN3_TEMPLATE

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory):
    from tests.tinyllm.test_families import make_family
    from tests.tinyllm.test_hf import save_bpe

    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    tok = save_bpe(path)
    make_family("qwen3", path, tok.get_vocab_size())
    (path / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    return path


def qwen3_app(path):
    app = build_app(build_parser().parse_args(["--model", str(path), "--device", "cpu", "--compile", "off"]))
    app.NOTIFICATION_TIMEOUT = 3600
    return app


async def test_a_think_block_streams_apart_from_the_answer():
    class One(App):
        CSS_PATH = ChatApp.CSS_PATH and str(Path(chat_app.__file__).parent / ChatApp.CSS_PATH)

        def compose(self):
            yield Reply("model")

    app = One()
    async with app.run_test() as pilot:
        reply = app.query_one(Reply)
        for piece in ["<thi", "nk>\nLet me ", "see.\n</th", "ink>\n\nThe ", "answer."]:
            await reply.write(piece)
            if piece == "<thi":
                assert reply.thought == "" and reply.text == ""  # maybe a tag: nothing shown yet
            if piece.startswith("nk>"):
                assert reply.thought == "Let me " and reply.has_class("-thinking") and reply.text == ""
                assert not reply.has_class("-thought")  # folded: the line only, until F3 or a click
        await reply.finish("eos")
        await pilot.pause()
        assert reply.thought == "Let me see." and reply.text == "The answer."
        assert reply.raw.startswith("<think>") and reply.query_one(".thought").styles.text_style.italic
        reply.toggle_thought()
        assert reply.has_class("-thought") and reply.query_one(".thought").display
        plain = Reply("model", "No thinking here.")
        await app.mount(plain)
        assert plain.thought == "" and not plain.has_class("-thinking") and plain.text == "No thinking here."
        plain.toggle_thought()  # nothing to open
        assert not plain.opened and not plain.query_one(".fold").display


async def test_the_switch_family_and_status_bar(qwen3_path):
    app = qwen3_app(qwen3_path)
    async with app.run_test(size=(140, 30)) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: "think on" in app.status.shown, what="think on")
        assert "qwen3" in app.status.shown and app.session.family == "qwen3"
        await pilot.press("f2")
        await wait_until(pilot, lambda: app.session.thinking is False and "think off" in app.status.shown)
        assert app.store.settings["thinking"] == "off"
        app.prompt.load_text("/set thinking on")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.session.thinking is True and "think on" in app.status.shown)
        assert app.store.settings["thinking"] == "on"
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "(qwen3)" in str(app.screen.query_one("#help").border_title)
        assert any(k == "F2" for k, _ in app.screen.keys)


async def test_thinking_does_not_apply_elsewhere(make_app):
    app = make_app()
    async with app.run_test(size=(140, 30)) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: "llama" in app.status.shown, what="the family")
        assert "think" not in app.status.shown
        app.prompt.load_text("/set thinking on")
        await pilot.press("enter")
        await wait_until(pilot, lambda: "does not apply" in app.conversation.query("SystemNote").last().text
                         if app.conversation.query("SystemNote") else False)
        assert "thinking" not in app.store.settings
