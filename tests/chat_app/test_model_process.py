"""The model process and the app around it (issue 31, section 5): a system prompt longer than
the context. Each test fails without its fix; none depends on timing."""

from __future__ import annotations

import os
import signal

import pytest

from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import held_in_child, loaded, notes, notices, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def errors(app) -> list[str]:
    """Error toasts, and the notes of refused commands (/system's)."""
    from chat_app.widgets.system_note import SystemNote

    return [n.message for n in app._notifications if n.severity == "error"] + [
        n.text for n in app.query(SystemNote) if n.severity == "error"]


async def test_a_system_prompt_too_long_is_named_and_long_echoes_are_cut(make_app):
    """Before: every message failed with "message too long: 12 tokens", and the whole system
    prompt was echoed in a notice that covered the screen."""
    app = make_app("--max-tokens", "8", "--max-len", "512")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/system " + "Be very brief. " * 400)
        await wait_until(pilot, lambda: errors(app), what="the refusal")
        assert errors(app)[0].startswith("the system prompt is too long") and len(errors(app)[0]) < 200
        await send(pilot, "Hi")  # the message is not blamed: the system prompt was never set
        assert len(app.session.messages) == 2 and len(errors(app)) == 1
        await send(pilot, "/clear")  # in a chat with messages the prompt is shown where it was set, whole
        await wait_until(pilot, lambda: not app.session.messages)
        await send(pilot, "/system " + "Short. " * 8 + "x" * 200)  # fits, but is long on one line
        await wait_until(pilot, lambda: any(n.startswith("System prompt set") for n in notes(app)))
        said = next(n for n in notes(app) if n.startswith("System prompt set"))
        assert len(said) < 140 and said.endswith("(256 characters)"), said


async def test_streaming_after_quit_began_is_dropped(make_held_app):
    """Before: quitting about 1.6 s into a reply printed "MountError: Can't mount widget(s) before
    Markdown() is mounted" (2 of ~13 quits): text that streamed in after exit() began was
    appended to the reply's Markdown, which is no longer attached then. Now it is dropped."""
    from textual.widgets import Markdown

    app, held = make_held_app("--max-tokens", "400")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello", wait=False)
        await wait_until(pilot, lambda: held and held[0].held.is_set() and app.query(Reply) and
                         app.query_one(Reply).text, what="the reply's first text on screen")
        reply = app.query_one(Reply)
        shown = reply.text
        app.exit()  # quitting has begun: nothing is attached any more
        await reply.write("\n\nA new paragraph, after quit began")  # the stream's task mounts it
        await reply.query_one(Markdown).append("\n\n- and a list")
        await reply.finish("stopped")  # was: MountError, from the stream's task
        assert reply.text.startswith(shown)


def fd_target(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
async def test_a_log_that_cannot_be_written_is_one_notice_and_the_chat_works(make_app, data_dir, monkeypatch):
    """Before: the model process died opening session.log (here a folder: unwritable, root or
    not), its traceback went over the TUI, and no chat was possible. Its output, even before its
    server loop (Python's own import-time report here), now never reaches the terminal."""
    (data_dir / "session.log").mkdir(parents=True)
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the child prints as it starts (this process is started)
    app = make_app("--max-tokens", "3")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.session is not None or errors(app), what="the model to load")
        assert app.session is not None, errors(app)
        assert [fd_target(app.session.pid, fd) for fd in (0, 1, 2)] == [os.devnull] * 3
        await send(pilot, "Hi")
        assert [m.role for m in app.session.messages] == ["user", "assistant"] and not errors(app)
        said = [n for n in notices(app) if "session.log" in n]
        assert len(said) == 1 and "cannot be written" in said[0], notices(app)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
async def test_the_model_process_writes_only_to_its_log_from_its_start(make_app, data_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # printed before the child's server loop runs
    app = make_app("--max-tokens", "3")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        log = str(data_dir / "session.log")
        assert [fd_target(app.session.pid, fd) for fd in (1, 2)] == [log, log]
    # imported before the server loop runs: was reported on the terminal (only later imports reached the log)
    assert "| tinyllm.session.chat_server" in (data_dir / "session.log").read_text()


async def test_a_model_process_killed_mid_reply_is_said_and_started_again(make_app, data_dir):
    """Before: after a kill -9 mid-reply every message said "the model process is not running"
    while the status bar said "ready". Now the status bar says so, and the next message starts a
    new process with the chat so far, which answers it."""
    app = held_in_child(make_app("--ignore-eos", "--max-tokens", "8"))  # the first reply waits mid-way
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a story", wait=False)
        await wait_until(pilot, lambda: app.controller.core.turn.text, what="the reply's first text")
        old = app.session.pid
        app.session.replies = 0  # the next process holds nothing
        os.kill(old, signal.SIGKILL)
        await wait_until(pilot, lambda: not app.busy, what="the reply to fail")
        assert "model process ended" in app.status.line and "ready" not in app.status.line
        assert errors(app) == ["the model process ended (exit code -9); the next message starts it again"]
        await send(pilot, "Are you back?", wait=False)  # said as the message goes (a notice lasts seconds)
        assert any("Starting the model process again" in n for n in notices(app))
        await wait_until(pilot, lambda: not app.busy and app.session is not None, what="the reply from a new process")
        assert app.session.pid != old and "· ready ·" in app.status.line
        messages = [(m.role, m.content) for m in app.session.messages]
        assert [r for r, _ in messages] == ["user", "assistant"] * 2 and messages[3][1], messages
        assert messages[0][1] == "Tell me a story" and messages[2][1] == "Are you back?"
        assert messages[1][1] == "".join(app.query(Reply).first().text)  # what streamed, reloaded
        assert len(errors(app)) == 1
