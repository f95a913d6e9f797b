"""The app with a real (tiny, random) model on the CPU, driven by Pilot."""

from __future__ import annotations

import re
import time

import pytest

from chat_app.app import DRAIN_HZ, ChatApp
from chat_app.store import Store
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply, printable
from tests.chat_app.conftest import Held, held_in_child, loaded, notices, saved_chat, send, wait_until

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
        assert "Fast step" in footer and "Help" in footer, footer
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
        assert "Fast step" in [k.description for k in app.query("FooterKey")]  # offered on every machine
        await pilot.press("ctrl+g")
        said = notices(app)
        assert any("No fast step to switch here" in n and "started with --compile off" in n for n in said), said
        await pilot.press("f1")
        assert "native C++ step on a CPU" in " ".join(str(w.render()) for w in app.screen.query("Static"))


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
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: not app.busy, what="the regenerated reply")
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
        assert any("regen_temperature 1.5" in n for n in notices(app))
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.busy)
        assert calls[-1][1].temperature == 1.5
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.session.messages)
        await send(pilot, "Hello")
        assert app.session.messages[-1].content == greedy
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.busy)
        assert len([n for n in notices(app) if "the chat is greedy" in n.lower()]) == 2  # once per chat
        await send(pilot, "/set temperature 0.7")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.busy)
        assert calls[-1][1].temperature == 0.7 and calls[-1][1].seed != calls[-2][1].seed  # sampling: its own
        assert len([n for n in notices(app) if "the chat is greedy" in n.lower()]) == 2
