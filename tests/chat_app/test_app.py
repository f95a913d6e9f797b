"""The app with a real (tiny, random) model on the CPU, driven by Pilot."""

from __future__ import annotations

import re
import time

import pytest

from chat_app.app import DRAIN_HZ, ChatApp
from chat_app.store import Store
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply, printable
from chat_app.widgets.system_note import SystemNote
from tests.chat_app.conftest import Held, held_in_child, loaded, notes, notices, regenerate, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


async def reply_streaming(pilot, app: ChatApp) -> None:
    """Wait until the reply has shown its first text."""
    await wait_until(pilot, lambda: app.query(Reply) and app.query_one(Reply).text, what="streamed text")


async def held_streaming(pilot, app: ChatApp, held: list[Held]) -> Held:
    """Wait until the held reply has shown its first text (it waits at the gate then)."""
    await wait_until(pilot, lambda: held and held[0].held.is_set(), what="the reply to be held")
    await reply_streaming(pilot, app)
    return held[0]


async def test_message_streams_a_reply_in_batches(make_held_app, data_dir, monkeypatch):
    writes: list[float] = []
    original = Reply.write

    async def counting_write(self, text):
        writes.append(time.monotonic())
        await original(self, text)

    monkeypatch.setattr(Reply, "write", counting_write)
    app, held = make_held_app("--max-tokens", "400")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert re.search(r"pos \d+/2048", app.status.line)
        t0 = time.monotonic()
        await send(pilot, "Hello there", wait=False)
        (await held_streaming(pilot, app, held)).release()  # one write so far: the first token
        assert app.busy and len(writes) == 1
        await wait_until(pilot, lambda: not app.busy, what="the reply to finish")
        elapsed = time.monotonic() - t0
        reply = app.session.messages[-1]
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert [w.text for w in app.query(UserMessage)] == ["Hello there"]
        assert app.query_one(Reply).text == printable(reply.content) != ""  # no token lost
        n_tokens = app.session.last_stats.tokens
        assert 1 < len(writes) < n_tokens, (len(writes), n_tokens)  # batches, not one per token
        assert len(writes) <= DRAIN_HZ * elapsed + 3
        assert re.search(r"\d+ tok/s", app.status.line), app.status.line
        assert re.search(r"W \d+ ", app.status.line) and "TTFT" in app.status.line, app.status.line
        assert "graphs" not in app.status.line and "cpu fp32" in app.status.line  # no graphs on a CPU
    saved = saved_chat(data_dir)
    assert [(m.role, m.content) for m in saved] == [("user", "Hello there"), ("assistant", reply.content)]


async def test_prompt_keys_newline_and_history(make_app):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert app.prompt.text == "a\nb\nc"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and len(app.session.messages) == 2)
        assert app.session.messages[0].content == "a\nb\nc"
        await send(pilot, "second")
        await pilot.press("x", "up")  # Up on the first line recalls; the draft comes back with Down
        assert app.prompt.text == "second"
        await pilot.press("up")
        assert app.prompt.text == "a\nb\nc"
        await pilot.press("down", "down", "down")
        assert app.prompt.text == "x"


async def test_ctrl_g_on_a_cpu_switches_the_native_step_mid_reply_and_changes_no_greedy_token(make_app):
    # the child holds the first reply after its first text until Ctrl+G (held_in_child): the
    # switch lands mid-reply, on any CPU
    app = held_in_child(make_app("--compile", "on", "--max-tokens", "120", "--ignore-eos"))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.pause()
        footer = [k.description for k in app.query("FooterKey")]
        assert "Fast" in footer and "Help" in footer, footer
        assert "native" in app.status.line.split(" · ")
        await send(pilot, "Hello", wait=False)
        await reply_streaming(pilot, app)
        await pilot.press("ctrl+g")  # mid-reply: the plain step, eagerly, from the next launch
        assert "eager" in app.status.line.split(" · ") and "native" not in app.status.line, app.status.line
        await wait_until(pilot, lambda: not app.busy, what="the reply to finish")
        flipped = app.session.messages[-1].content
        assert app.session.last_stats.step == "eager" and app.session.last_stats.tokens == 120
        assert "eager" in app.status.line.split(" · ")
        assert any("plain step, run eagerly" in n for n in notices(app))
        await pilot.press("ctrl+g")
        assert "native" in app.status.line.split(" · ") and "eager" not in app.status.line, app.status.line
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.session.messages)
        await send(pilot, "Hello")
        assert app.session.last_stats.step == "native"
        assert app.session.messages[-1].content == flipped  # the same greedy tokens
        assert not [n for n in app._notifications if n.severity == "error"]
        assert "graphs" not in app.status.line  # no CUDA graphs on a CPU


async def test_ctrl_g_says_why_where_a_cpu_session_runs_no_native_step(make_app):
    app = make_app("--max-tokens", "5")  # --compile off: the plain step
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.pause()
        assert "Fast" in [k.description for k in app.query("FooterKey")]  # offered on every machine
        await pilot.press("ctrl+g")
        said = notices(app)
        assert any("No fast step to switch here" in n and "started with --compile off" in n for n in said), said
        await pilot.press("f1")
        assert any("native C++ step on a CPU" in text for _, text in app.screen.keys)  # F1's key table


async def test_escape_stops_mid_reply_and_next_message_works(make_app, data_dir):
    app = held_in_child(make_app("--max-tokens", "100000", "--ignore-eos"))  # ends only at Esc
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a long story", wait=False)
        await reply_streaming(pilot, app)
        await send(pilot, "Too soon", wait=False)  # refused while the reply runs; the text stays
        assert app.prompt.text == "Too soon" and any("still running" in n for n in notices(app))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.busy, what="the reply to stop")
        stopped = app.session.messages[-1]
        assert stopped.stopped and stopped.role == "assistant"
        assert app.session.last_stats.tokens <= 2  # held at its first token until Esc
        reply = app.query_one(Reply)
        assert reply.text == printable(stopped.content) and reply.has_class("-noted")
        await app.run_command("/set max_tokens 20")
        await pilot.press("enter")  # "Too soon" is still in the input: send it now
        await wait_until(pilot, lambda: not app.busy and len(app.session.messages) == 4)
        assert [w.text for w in app.query(UserMessage)] == ["Tell me a long story", "Too soon"]
        assert len(app.query(Reply)) == 2 and app.session.messages[-1].content
    saved = saved_chat(data_dir)
    assert [m.stopped for m in saved] == [False, True, False, False]


async def test_ctrl_r_regenerates(make_app, data_dir):
    app = make_app("--max-tokens", "30", "--temperature", "1")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        old_widget = app.query_one(Reply)
        await regenerate(pilot)
        await pilot.pause()
        assert app.query_one(Reply) is not old_widget
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert len(app.query(Reply)) == 1
        assert app.query_one(Reply).text == printable(app.session.messages[-1].content)
    saved = saved_chat(data_dir)
    assert [(m.role, m.content) for m in saved] == [("user", "Hello"),
                                                    ("assistant", app.session.messages[-1].content)]


async def test_conversation_longer_than_context_keeps_working(make_app):
    app = make_app("--max-len", "128", "--max-tokens", "40")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        prompts = [f"Question number {i}: what is the capital of France?" for i in range(5)]
        for text in prompts:
            await send(pilot, text)
        assert any("Context full" in n for n in notices(app))
        assert [w.text for w in app.query(UserMessage)] == prompts  # everything stays on screen
        assert len(app.query(Reply)) == 5 and len(app.session.messages) == 10
        assert app.session.first_message > 0
        await send(pilot, "word " * 300, wait=False)  # too long for any context: an error, the chat is kept
        # a notice reaches app._notifications as a message of its own, after the handler that
        # freed the app: wait for both
        await wait_until(pilot, lambda: not app.busy and any(
            n.severity == "error" and "too long" in n.message for n in app._notifications), what="the error notice")
        assert app.prompt.text.startswith("word word")  # given back to edit
        assert len(app.query(UserMessage)) == 5 and len(app.session.messages) == 10
        app.prompt.clear()
        await send(pilot, "Still there?")
        assert len(app.session.messages) == 12
    app = make_app("--max-len", "128", "--max-tokens", "40", "--resume")  # more than fits, resumed
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 12, what="the resumed chat")
        assert len(app.query(UserMessage)) == 6
        await send(pilot, "And after a restart?")
        assert len(app.session.messages) == 14 and app.session.messages[-1].role == "assistant"


async def test_set_changes_sampling(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for command in ["/set temperature 0.7", "/set top_p 0.9", "/set top-k 5", "/set seed 3",
                        "/set repeat_penalty 1.1", "/set max_tokens 12"]:
            await send(pilot, command)
        p = app.session.params
        assert (p.temperature, p.top_p, p.top_k, p.seed, p.repeat_penalty, p.max_tokens) == (
            0.7, 0.9, 5, 3, 1.1, 12)
        for bad in ["/set temperature -1", "/set top_k lots", "/set colour blue", "/frobnicate"]:
            await send(pilot, bad)
        assert app.session.params == p
        errors = [n.text for n in app.query(SystemNote) if n.severity == "error"]  # notes, not toasts
        assert len(errors) == 4 and not notices(app), errors
        await send(pilot, "Hi")
        assert app.session.last_stats.tokens <= 12


async def test_export_and_commands(make_app, tmp_path):
    app = make_app("--max-tokens", "20")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/system You are terse.")
        await wait_until(pilot, lambda: app.session.system == "You are terse.")
        await send(pilot, "Hello export")
        await send(pilot, "Second turn")
        out = tmp_path / "chat.md"
        await send(pilot, f"/export {out}")
        await wait_until(pilot, lambda: any("Exported" in n for n in notices(app)), what="the export (a worker writes it)")
        text = out.read_bytes().decode()
        assert "# Chat with tiny-test" in text and "You are terse." in text
        assert "## You\n\nHello export" in text and "## You\n\nSecond turn" in text
        for m in app.session.messages[1::2]:
            assert m.content.strip() in text
        await send(pilot, "/stats")
        assert any("tok/s" in n and "first token after" in n for n in notes(app))
        await send(pilot, "/help")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await send(pilot, "/clear")
        await wait_until(pilot, lambda: not app.query(UserMessage) and not app.session.messages)
        await send(pilot, "Fresh start")
        assert len(app.session.messages) == 2


async def test_resume_restores_the_last_chat(make_app):
    app = make_app("--max-tokens", "20")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Remember me")
        first = [(m.role, m.content) for m in app.session.messages]
    app = make_app("--resume", "--max-tokens", "20")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        assert [(m.role, m.content) for m in app.session.messages] == first
        assert [w.text for w in app.query(UserMessage)] == ["Remember me"]
        assert app.query_one(Reply).text == printable(first[1][1])
        await send(pilot, "And now?")
        assert len(app.session.messages) == 4 and len(app.query(Reply)) == 2


async def test_new_chat_mid_reply(make_app, data_dir):
    app = held_in_child(make_app("--max-tokens", "100000", "--ignore-eos"))  # ends only at Ctrl+N
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Go on and on", wait=False)
        await reply_streaming(pilot, app)
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.busy and not app.query(Reply))
        assert app.session.messages == [] and app.store.conversation is None
    saved = saved_chat(data_dir)  # the stopped chat was kept in full
    assert [(m.role, m.stopped) for m in saved] == [("user", False), ("assistant", True)]


async def test_escape_before_the_reply_begins_still_stops_it(make_app):
    app = held_in_child(make_app("--max-tokens", "100000", "--ignore-eos"))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello", wait=False)
        app.action_stop()  # the worker may not have started the reply yet
        await wait_until(pilot, lambda: not app.busy)
        assert app.session.messages[-1].stopped and app.session.last_stats.tokens <= 2


async def test_a_model_that_fails_to_load_is_an_error_not_a_crash(tmp_path):
    def broken(**_):
        raise RuntimeError("CUDA out of memory")

    app = ChatApp(broken, Store.open(tmp_path), model_name="broken")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: any(n.severity == "error" and "out of memory" in n.message
                                            for n in app._notifications), what="the error notice")
        assert app.status.fields["state"] == "failed"
        await send(pilot, "Hello?", wait=False)
        await pilot.press("ctrl+r", "ctrl+g")
        assert app.prompt.text == "Hello?" and app.session is None


async def test_command_output_is_a_note_in_the_conversation(make_app, data_dir):
    """Issue 34, item 5: /show's output was a toast that vanished and covered the reply. Now a
    note in the conversation (plain text), not a toast, not in the store, not seen by the model;
    a reply after it streams as before, under it."""
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/system Be [b]brief[/b].")
        await wait_until(pilot, lambda: notes(app) == ["System prompt set: Be [b]brief[/b]."], what="/system's note")
        await send(pilot, "/show")
        await send(pilot, "/nope")
        shown = app.query(SystemNote)
        assert len(shown) == 3 and shown[1].text.startswith("Model: tiny-test on cpu")
        assert "System prompt: Be [b]brief[/b]." in str(shown[1].render())  # as typed, never markup
        assert shown[2].severity == "error" and shown[2].has_class("-error")
        assert not notices(app)  # no toasts
        await send(pilot, "Hello after show")
        assert [m.role for m in app.session.messages] == ["user", "assistant"]  # the model never saw them
        assert [m.role for m in app.store.messages() if m.role != "system"] == ["user", "assistant"]
        assert not any("Model:" in m.content for m in app.store.messages())
        order = [type(w).__name__ for w in app.conversation.children]
        assert order == ["SystemNote", "SystemNote", "SystemNote", "UserMessage", "Reply"], order
        assert app.query_one(Reply).text == printable(app.session.messages[-1].content)
        for _ in range(3):
            await send(pilot, "/show")  # more than the screen holds
        await send(pilot, "/stats")  # a note at the bottom, in view
        await pilot.pause()
        last, view = app.conversation.children[-1], app.conversation.region
        assert last.text.startswith("Last reply:") and view.y <= last.region.y < last.region.bottom <= view.bottom
        app.conversation.focus()
        await pilot.press("end")
        assert app.conversation.picked_text() == ("note", notes(app)[-1])  # pickable, copyable
    saved = saved_chat(data_dir)
    assert [(m.role, m.content) for m in saved if m.role != "system"][0] == ("user", "Hello after show")


@pytest.mark.parametrize("width", [80, 100])
async def test_help_descriptions_wrap_under_themselves(make_app, width):
    """Issue 34, item 10: at 80 and 100 columns a long description went on at column 0, under
    the keys. Each line of F1 now starts with a key or command, or is indented to the
    descriptions' column."""
    from chat_app.widgets.help_screen import HelpScreen
    from tests.chat_app.test_labels import screen_text

    app = make_app()
    async with app.run_test(size=(width, 100)) as pilot:  # tall enough for the whole help, unscrolled
        await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        names = [name for name, _ in help_screen.keys + help_screen.commands]
        column = max(len(n) for n in names) + 3
        left = help_screen.query_one("#help").content_region.x
        screen = screen_text(app).splitlines()
        top = next(i for i, line in enumerate(screen) if "tinyllm-chat help" in line)
        bottom = next(i for i, line in enumerate(screen) if "Esc, F1 or q closes" in line)
        lines = [line[left:].rstrip("█ ") for line in screen[top + 1:bottom]]
        about, lines = lines[:lines.index("Keys")], lines[lines.index("Keys"):]  # the model's section: prose
        assert "Model" in about, about
        rows = [line for line in lines if line[:column].rstrip() in names]
        wrapped = [line for line in lines if line.startswith(" ") and line.strip()]
        assert len(rows) == len(names), (rows, names)
        assert wrapped, "nothing wrapped at this width: the test shows nothing"
        assert all(line[:column].strip() == "" and line[column] != " " for line in wrapped), wrapped
        assert not set(lines) - set(rows) - set(wrapped) - {"", "Keys", "Commands"}, lines


async def test_ctrl_r_in_a_greedy_chat_samples_at_regen_temperature_and_says_so_once(make_app):
    app = make_app("--max-tokens", "12")  # temperature 0: greedy
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        greedy = app.session.messages[-1].content
        calls: list[tuple] = []  # what the app's worker hands the session
        for name in ("regenerate", "send"):
            method = getattr(app.session, name)
            setattr(app.session, name, lambda *a, method=method, name=name: calls.append((name, *a)) or method(*a))
        for _ in range(2):
            await regenerate(pilot)
        regens = [c[1] for c in calls]
        assert [c[0] for c in calls] == ["regenerate"] * 2
        assert all(p.temperature == 0.8 and isinstance(p.seed, int) for p in regens), regens
        assert regens[0].seed != regens[1].seed  # a fresh seed each time
        told = [n for n in notices(app) if "the chat is greedy" in n.lower()]
        assert told == ["The chat is greedy: Ctrl+R samples at temperature 0.8; /set regen_temperature to change."]
        assert app.session.params.temperature == 0 and app.session.params.seed is None  # the chat's stay
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        await send(pilot, "Hello again")
        assert calls[-1] == ("send", "Hello again")  # the next message: the chat's own (greedy) settings
        await send(pilot, "/set regen_temperature 1.5")
        await send(pilot, "/show")
        assert any("regen_temperature 1.5" in n for n in notes(app))  # /show: a note (item 5)
        await regenerate(pilot)
        assert calls[-1][1].temperature == 1.5
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.session.messages)
        await send(pilot, "Hello")
        assert app.session.messages[-1].content == greedy
        await regenerate(pilot)
        assert len([n for n in notices(app) if "the chat is greedy" in n.lower()]) == 2  # once per chat
        await send(pilot, "/set temperature 0.7")
        await regenerate(pilot)
        assert calls[-1][1].temperature == 0.7 and calls[-1][1].seed != calls[-2][1].seed  # sampling: its own
        assert len([n for n in notices(app) if "the chat is greedy" in n.lower()]) == 2
