"""Issue 52, part 4: a reply's thinking folded to one line ("▸ thought for 12 words (F3)"), opened
and closed by F3 or a click, live while it streams; kept raw in the store, marked in the export;
not sent to the model again where the template drops it (Qwen 3's). Waits on state, never on time.

The app tests script the reply: `Thinks` wraps the app's real session (a child process) and,
for each message, lets the real reply run, then gives the app a scripted one instead: a
`<think>` block, held at a gate until the test releases it, then an answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App

import chat_app
from chat_app.app import ChatApp
from chat_app.history import markdown
from chat_app.thinking import count_words, split_thought
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import Held, loaded, rows, send, wait_until
from tests.chat_app.test_thinking import qwen3_app, qwen3_path  # noqa: F401 (the fixture)
from tinyllm.session.chat_events import Finished, Prefilled, Token

pytestmark = pytest.mark.anyio

THOUGHT = "<think>\nThe user greets me.\nI greet back, \x1b]0;title\x07politely.\n</think>\n\nHello there!"
BEFORE_GATE = "<think>\nThe user greets"


class Thinks(Held):
    """The app's session, each reply scripted: THOUGHT's first words, the gate, then the rest."""

    def send(self, text: str):
        return self._script(self._session.send(text))

    def _script(self, real):
        events = list(real)  # the real reply first: the session's turn is whole
        stats = next(e for e in events if isinstance(e, Finished)).stats
        yield from (e for e in events if isinstance(e, Prefilled))
        yield Token(BEFORE_GATE, stats)
        if not self.gate.is_set():
            self.held.set()
            self.gate.wait(timeout=300)
            self.held.clear()
        rest = THOUGHT[len(BEFORE_GATE):]
        yield Token(rest[:20], stats)
        yield Token(rest[20:], stats)
        yield Finished("eos", THOUGHT, stats)


class One(App):
    CSS_PATH = str(Path(chat_app.__file__).parent / ChatApp.CSS_PATH)

    def compose(self):
        yield Reply("model")


def shown(reply: Reply, cls: str) -> bool:
    return reply.query_one(f".{cls}").display


def test_what_is_thinking():
    assert split_thought("<think>\nhm\n</think>\n\nYes.") == ("hm", "Yes.", True)
    assert split_thought("  <think>\nstill going") == ("still going", "", False)
    assert split_thought("<thi") == (None, "", False)  # maybe a tag: nothing yet
    assert split_thought("<think>\n\n</think>\n\nYes.") == (None, "Yes.", True)  # thinking off: an empty block
    assert split_thought("R1 reasons here.\n</think>\n\nYes.") == ("R1 reasons here.", "Yes.", True)  # DeepSeek-R1
    assert split_thought("No thinking.") == (None, "No thinking.", False)
    assert count_words("one two\nthree") == 3 and count_words("你好世界 ok") == 5 and count_words("") == 0


async def test_the_line_folds_opens_and_closes():
    app = One()
    async with app.run_test() as pilot:
        reply = app.query_one(Reply)
        await reply.write("<thi")
        assert not reply.has_thought and not shown(reply, "fold") and reply.text == ""
        await reply.write("nk>\nLet me ")
        await pilot.pause()
        assert reply.fold_line == "▸ thinking… 2 words (F3)" and shown(reply, "fold")
        assert not shown(reply, "thought") and reply.text == ""
        reply.toggle_thought()  # opened live: what streams shows as it comes
        await reply.write("see.\n</th")
        await pilot.pause()
        assert shown(reply, "thought") and reply.fold_line.startswith("▾ thinking…")
        assert "Let me see." in str(reply.query_one(".thought").render())
        await reply.write("ink>\n\nThe ")
        await reply.write("answer.")
        await reply.finish("eos")
        await pilot.pause()
        assert reply.fold_line == "▾ thought for 3 words (F3)" and reply.thought == "Let me see."
        assert reply.text == "The answer." and reply.raw.startswith("<think>")
        assert reply.query_one(".thought").styles.text_style.italic
        await pilot.click(".fold")  # a click folds it again
        await pilot.pause()
        assert reply.fold_line == "▸ thought for 3 words (F3)" and not shown(reply, "thought")
        await pilot.click(".fold")
        await pilot.pause()
        assert shown(reply, "thought") and reply.opened


async def test_cut_short_empty_and_deepseek_shapes():
    app = One()
    async with app.run_test() as pilot:
        cut = Reply("model", "<think>\nhalf a thou", note="stopped")  # a reply stopped while it thought
        empty = Reply("model", "<think>\n\n</think>\n\nJust the answer.")
        r1 = Reply("model")
        await app.mount(cut, empty, r1)
        assert cut.fold_line == "▸ thought for 3 words, cut short (F3)"
        assert not empty.has_thought and not shown(empty, "fold") and empty.text == "Just the answer."
        await r1.write("Reasoning as it ")  # DeepSeek-R1: the block's end only; answer until it comes
        await pilot.pause()
        assert not r1.has_thought and r1.text.startswith("Reasoning")
        await r1.write("goes.\n</think>\n\nThe answer.")
        await r1.finish("eos")
        await pilot.pause()
        assert r1.thought == "Reasoning as it goes." and r1.text == "The answer."
        assert r1.fold_line == "▸ thought for 4 words (F3)"


async def test_f3_opens_the_last_thinking_live_and_the_chat_keeps_it(make_held_app, data_dir):
    app, opened = make_held_app("--max-tokens", "4", wrapper=Thinks)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hi", wait=False)
        await wait_until(pilot, lambda: opened[0].held.is_set() and app.conversation.query(Reply)
                         and app.conversation.query(Reply).last().has_thought, what="the thinking to stream")
        reply = app.conversation.query(Reply).last()
        assert reply.fold_line == "▸ thinking… 3 words (F3)" and not shown(reply, "thought")
        await pilot.press("f3")
        await wait_until(pilot, lambda: shown(reply, "thought") and reply.fold_line.startswith("▾ thinking…"))
        opened[0].release()
        await wait_until(pilot, lambda: not app.busy, what="the reply to end")
        await pilot.pause()
        assert reply.fold_line == "▾ thought for 8 words (F3)" and reply.text == "Hello there!"
        assert "␛]0;title" in reply.thought  # a control shown, never sent to the terminal
        await pilot.press("f3")
        await wait_until(pilot, lambda: not shown(reply, "thought"))
        assert reply.fold_line.startswith("▸ thought for")
        await pilot.press("f1")  # F3 is in the help where a reply has thinking
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert any(k == "F3" and "thinking" in does for k, does in app.screen.keys)
        await pilot.press("escape")
        stored = [content for _, _, role, content, _, _ in rows(data_dir) if role == "assistant"]
        assert stored == [THOUGHT]  # the store keeps the reply as the model wrote it, tags and all
        exported = markdown(app.store, app.store.chat)
        assert "> **Thinking**\n>\n> The user greets me.\n> I greet back, ␛]0;title␇politely.\n\nHello there!" \
            in exported and "<think>" not in exported and "\x1b" not in exported


async def test_f3_picks_the_picked_reply_and_says_when_there_is_none(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        assert not app.check_action("toggle_thought", ())  # a llama: no switch, no reply with thinking
        conversation = app.conversation
        first = await conversation.add_reply("model", "<think>\nfirst\n</think>\n\nA1")
        await conversation.add_reply("model", "<think>\nsecond\n</think>\n\nA2")
        plain = await conversation.add_reply("model", "no thinking")
        assert app.check_action("toggle_thought", ())
        await pilot.press("f3")
        await pilot.pause()
        last = conversation.query(Reply)[1]
        assert last.opened and not first.opened and not plain.has_thought  # the last one WITH thinking
        conversation.focus()
        conversation.pick(first)
        await pilot.press("f3")
        await pilot.pause()
        assert first.opened and last.opened
        await conversation.clear()
        app.action_toggle_thought()
        await wait_until(pilot, lambda: any("No reply here has thinking" in n.message for n in app._notifications))


async def test_a_qwen3_chat_folds_thinking_and_does_not_send_it_again(qwen3_path, data_dir):  # noqa: F811
    """Qwen 3 (its own template): the reply's thinking folded on screen, kept in chat.db; the next
    turn's context, as the model process renders it, holds the answer but not the thinking."""
    from tests.tinyllm.test_chat_thinking import qwen3
    from tests.tinyllm.test_conversation import Bytes, Cache
    from tinyllm.session.conversation import Conversation

    app = qwen3_app(qwen3_path)
    opened: list[Thinks] = []
    real_open = app.open_session

    def open_thinking(**kwargs):
        opened.append(Thinks(real_open(**kwargs)))
        opened[-1].release()
        return opened[-1]

    app.open_session = open_thinking
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.session.set_param("max_tokens", "4")
        await send(pilot, "Hi")
        reply = app.conversation.query(Reply).last()
        assert reply.fold_line == "▸ thought for 8 words (F3)" and app.check_action("toggle_thought", ())
    said = [(role, content) for _, _, role, content, _, _ in rows(data_dir)]
    assert said == [("user", "Hi"), ("assistant", THOUGHT)]
    c = Conversation(Bytes(), qwen3(), 4096, Cache())  # the model process's part that renders turns
    c.load_messages([*said, ("user", "Next?")])
    context = bytes(i - 3 for i in c.context if i > 2).decode()
    assert "Hello there!" in context and "greets" not in context and "<think>\nThe" not in context
