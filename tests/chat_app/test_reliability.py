"""Nothing lost, nothing crashes: a broken store, a failed Ctrl+R, two instances, a crash
mid-reply, keys at the wrong moment, /export over a file. Each test fails without its fix."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import pytest

from chat_app.store import Saved, Store, StoreError
from chat_app.terminal import VISIBLE_ESC, PasteGuard
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.prompt_input import PromptInput, clean_paste
from chat_app.widgets.reply import Reply, printable
from tests.chat_app.conftest import Held, loaded, notices, regenerate, rows, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def errors(app) -> list[str]:
    """Error toasts, and the notes of refused commands (/set's, /export's)."""
    from chat_app.widgets.system_note import SystemNote

    return [n.message for n in app._notifications if n.severity == "error"] + [
        n.text for n in app.query(SystemNote) if n.severity == "error"]


def corrupt(path) -> None:
    path.write_bytes(b"this is not an SQLite database" * 200)


# ---- 1. a store error keeps the app and the message ----------------------------------------

async def test_broken_store_on_first_send_keeps_the_chat_and_recovers(make_app, data_dir):
    data_dir.mkdir()
    corrupt(data_dir / "chat.db")
    app = make_app("--max-tokens", "8")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert any("chat.db" in e and "mv " in e for e in errors(app)), errors(app)  # says where, what to do
        await send(pilot, "Keep this message")
        assert app.is_running and [w.text for w in app.query(UserMessage)] == ["Keep this message"]
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert app.store.pending
        (data_dir / "chat.db").rename(data_dir / "chat.db.broken")  # what the notice said to do
        await send(pilot, "Second")  # the next write reconnects and writes everything pending
        assert not app.store.pending and any("saved again" in n for n in notices(app))
    assert [m.content for m in saved_chat(data_dir)][::2] == ["Keep this message", "Second"]


async def test_malformed_store_on_resume_is_a_notice(make_app, data_dir):
    store = Store.open(data_dir)
    for i in range(300):
        store.add(Saved("user" if i % 2 == 0 else "assistant", f"message {i} " * 40))
    store.close()
    db = data_dir / "chat.db"
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    data[4096 * 3:4096 * 6] = b"\xff" * (4096 * 3)  # pages in the middle of the messages table
    db.write_bytes(bytes(data))
    app = make_app("--max-tokens", "8", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: any("could not resume" in e for e in errors(app)))
        assert any("malformed" in e or "not a database" in e for e in errors(app)), errors(app)
        await send(pilot, "Still works")
        assert app.is_running and len(app.session.messages) == 2


def test_store_write_failure_keeps_everything_in_memory(tmp_path):
    store = Store.open(tmp_path)
    store.add(Saved("user", "one"))
    store.close()
    corrupt(tmp_path / "chat.db")
    store = Store.open(tmp_path)
    assert store.error and "chat.db" in store.error
    with pytest.raises(StoreError, match="move it away"):
        store.add(Saved("user", "two"))
    assert [m.content for m in store.messages()] == ["two"]
    out = tmp_path / "rescued.md"
    assert store.export_markdown(out) == 1 and "two" in out.read_text()  # export works from memory


def test_fatal_error_is_one_line_exit_1_and_a_log(capsys, data_dir, monkeypatch):
    import chat_app.__main__ as cli

    def explode(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(cli, "build_app", explode)
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "RuntimeError: boom" in err and str(data_dir / cli.LOG_NAME) in err
    assert "Traceback" in (data_dir / cli.LOG_NAME).read_text()


async def test_an_uncaught_error_in_the_app_is_kept_for_main(make_app):
    app = make_app()
    with pytest.raises(ZeroDivisionError):  # Pilot re-raises it when the test ends
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            app.call_later(lambda: 1 / 0)
            await wait_until(pilot, lambda: app.crash is not None)
    assert isinstance(app.crash, ZeroDivisionError) and app.return_code == 1


# ---- 5. a failed Ctrl+R keeps the previous reply; settings are checked on entry -----------

async def test_failed_regenerate_keeps_the_previous_reply(make_app, data_dir, monkeypatch):
    app = make_app("--max-tokens", "10")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        before = [(m.role, m.content) for m in app.session.messages]

        def refused(*params):  # what the RemoteSession raises when the child's regenerate fails first
            raise ValueError("OverflowError: Overflow when unpacking long")

        # The session is in the child process: the failure is made at the interface the app
        # calls. That the session itself is all or nothing: tests/tinyllm/test_chat_reliability.py.
        monkeypatch.setattr(app.session, "regenerate", refused)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.busy and errors(app), what="the failed regenerate")
        assert any("Overflow" in e for e in errors(app))
        assert [(m.role, m.content) for m in app.session.messages] == before
        assert len(app.query(Reply)) == 1 and app.query_one(Reply).text == printable(before[1][1])
        monkeypatch.undo()
        await regenerate(pilot)  # and it still works afterwards
        assert len(errors(app)) == 1
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
    assert [(m.role, m.content) for m in saved_chat(data_dir)] == [
        (m.role, m.content) for m in app.session.messages]


async def test_set_refuses_huge_seeds_and_nan(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        params = app.session.params
        for bad in ["/set seed 99999999999999999999999", "/set temperature nan", "/set top_p inf",
                    "/set repeat_penalty nan"]:
            await send(pilot, bad)
        assert app.session.params == params and len(errors(app)) == 4, errors(app)


# ---- 6. two instances on one data folder --------------------------------------------------

def test_two_instances_never_share_a_conversation(tmp_path):
    a = Store.open(tmp_path)
    a.add(Saved("user", "A asks"))
    a_reply = Saved("assistant", "")  # a reply that never began: Ctrl+R deletes it
    a.add(a_reply)
    b = Store.open(tmp_path)
    got, held = b.resume_last()
    assert got == [] and held  # A holds its chat: B gets a new one (and says why)
    b.add(Saved("user", "B asks"))
    b.add(Saved("assistant", "B's reply"))  # the newest row of all
    a.branch(a_reply)  # A's Ctrl+R deletes A's own reply, not the newest row
    assert [r[3] for r in rows(tmp_path)] == ["A asks", "B asks", "B's reply"]
    a.close()
    c = Store.open(tmp_path)
    assert [m.content for m in c.resume_last()[0]] == ["A asks"]  # free again once A closed
    b.close()
    c.close()


async def test_second_instance_resume_gets_a_new_chat_and_a_notice(make_app, data_dir):
    first = Store.open(data_dir)
    first.add(Saved("user", "held elsewhere"))
    app = make_app("--max-tokens", "5", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert any("open in another tinyllm-chat" in n for n in notices(app))
        assert not app.query(UserMessage)
        await send(pilot, "mine")
    first.close()
    assert [r[1] for r in rows(data_dir)] == [1, 2, 2]  # two conversations


# ---- 8. a crash mid-reply keeps the partial reply; the resumed chat continues -------------

async def test_partial_reply_is_saved_while_streaming_and_resumes(make_held_app, make_app, data_dir):
    app, held = make_held_app("--max-tokens", "100000")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a story", wait=False)
        await wait_until(pilot, lambda: held and held[0].held.is_set())
        # while the reply streams, another reader sees it saved, marked partial
        await wait_until(pilot, lambda: [(r[2], r[5]) for r in rows(data_dir)] == [("user", 0), ("assistant", 1)]
                         and rows(data_dir)[1][3], what="the partial reply in chat.db")
        partial = rows(data_dir)[1][3]
        assert partial == "".join(app.controller.core.turn.text) or partial  # the text that had streamed
        app.store.db.close()  # the process "dies": nothing more reaches chat.db
        app.store.db = None
        app.store.path = data_dir / "gone" / "chat.db"
    held[0].release()
    app = make_app("--max-tokens", "5", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        assert app.query_one(Reply).has_class("-noted") and app.query_one(Reply).text == printable(partial)
        await pilot.press("ctrl+r")  # "no reply to regenerate" before
        await wait_until(pilot, lambda: not app.busy and app.session.messages[-1].content != partial)
        assert not errors(app)
        await send(pilot, "And then?")
        assert [m.role for m in app.session.messages] == ["user", "assistant"] * 2
    assert [(m.role, m.partial) for m in saved_chat(data_dir)] == [("user", False), ("assistant", False)] * 2


async def test_a_message_is_in_chat_db_before_the_model_is_asked(make_held_app, make_app, data_dir):
    """Issue 52, defect 5: killed 50 ms after Enter, the message was only in the prompt history
    (it was saved when its reply began), so --resume showed nothing. Now it is in chat.db before
    anything else happens to it: here the model is never asked before the app "dies"; --resume
    shows it. A message the session refuses leaves chat.db again, as it goes back to the input."""
    seen: list[list[tuple]] = []

    class NeverAsked(Held):
        """The session, whose send records what chat.db holds as the model would be asked, and
        then waits (the app dies meanwhile)."""
        def send(self, text):
            seen.append([(r[2], r[3]) for r in rows(data_dir)])
            self.held.set()
            self.gate.wait(timeout=300)
            return super().send(text)

    app, held = make_held_app("--max-tokens", "5", wrapper=NeverAsked)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Remember me", wait=False)
        assert [(r[2], r[3]) for r in rows(data_dir)] == [("user", "Remember me")]  # at once, on Enter
        await wait_until(pilot, lambda: held and held[0].held.is_set(), what="the model to be asked")
        assert seen == [[("user", "Remember me")]]
        app.store.db.close()  # the process "dies" before its reply begins: nothing more reaches chat.db
        app.store.db = None
        app.store.path = data_dir / "gone" / "chat.db"
    app = make_app("--max-len", "128", "--max-tokens", "5", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        assert [w.text for w in app.query(UserMessage)] == ["Remember me"]
        before = rows(data_dir)
        await send(pilot, "word " * 300, wait=False)  # too long for the context: refused
        await wait_until(pilot, lambda: not app.busy and any("too long" in e for e in errors(app)),
                         what="the refusal")
        assert app.prompt.text.startswith("word word") and rows(data_dir) == before  # back in the input, not in the chat
        app.prompt.clear()
        await send(pilot, "Still here?")
    assert [(m.role, m.content) for m in saved_chat(data_dir) if m.role == "user"] == [
        ("user", "Remember me"), ("user", "Still here?")]


async def test_quitting_mid_reply_never_waits_on_a_frozen_model_process(make_app):
    """The model process freezes mid-reply (SIGSTOP: it reads nothing, sends nothing). Quitting
    still ends the app's worker, which was waiting for the reply's next tokens, and the process."""
    app = make_app("--max-tokens", "100000", "--ignore-eos")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a story", wait=False)
        await wait_until(pilot, lambda: app.controller.core.turn.text, what="the reply's first tokens")
        session, worker = app.session, next(w for w in app.workers if w.name == "session")
        os.kill(session.pid, signal.SIGSTOP)
    end = time.monotonic() + 120  # close() waits 5 s for the process, then kills it
    while not (worker.is_finished and session._proc.poll() is not None) and time.monotonic() < end:
        await asyncio.sleep(0.05)
    assert worker.is_finished and session._proc.poll() is not None


async def test_resume_of_a_chat_ending_with_a_user_turn(make_app, data_dir):
    store = Store.open(data_dir)
    store.add(Saved("user", "asked, then the power went"))
    store.close()
    app = make_app("--max-tokens", "5", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        await send(pilot, "Hello again")
        roles = [m.role for m in app.session.messages]
        assert roles == ["user", "assistant"] * 2, roles  # never two user turns in a row
        await regenerate(pilot)
        assert not errors(app)


# ---- 7. keys at the wrong moment ------------------------------------------------------------

async def test_text_typed_after_enter_is_kept(make_app):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.load_text("first message")
        entered = PromptInput.Submitted("first message", "first message")  # what Enter posted ...
        app.prompt.move_cursor(app.prompt.document.end)
        app.prompt.insert("\nnext one")  # ... then keys arrived before the app took the text
        app.prompt.post_message(entered)
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.busy)
        assert app.session.messages[0].content == "first message"
        assert app.prompt.text == "next one"


async def test_only_carets_are_not_sent(make_app):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("^", "^", "enter")
        await pilot.pause()
        assert not app.busy and app.session.messages == [] and app.prompt.text == ""


async def test_a_paste_is_text_never_keystrokes(make_app):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        from textual import events

        app.prompt.post_message(events.Paste("a\x1b[A\x11b\r\nc\rd"))
        await pilot.pause()
        assert app.is_running and not app.busy and app.session.messages == []
        assert app.prompt.text == "a\u241b[A\u2411b\nc\nd"


def test_paste_guard_keeps_escapes_inside_a_paste_as_text():
    from textual._xterm_parser import XTermParser

    raw = "x\x1b[200~a\x1b[Ab\x11\r\x1b\x1b[201~y"
    for split in range(len(raw) + 1):  # the terminal's reads may split it anywhere
        guard = PasteGuard()
        text = guard.feed(raw[:split]) + guard.feed(raw[split:]) + guard.idle()  # what follows the end waits for idle
        assert text == f"x\x1b[200~a{VISIBLE_ESC}[Ab\x11\r{VISIBLE_ESC}\x1b[201~y", (split, text)
    parser = XTermParser()
    guard = PasteGuard()
    got = list(parser.feed(guard.feed(raw) + guard.idle()))
    names = [type(e).__name__ for e in got]
    assert names == ["Key", "Paste", "Key"], got  # x, the paste, y: nothing replayed as keys
    assert clean_paste(got[1].text) == f"a{VISIBLE_ESC}[Ab\u2411\n{VISIBLE_ESC}"


def test_invalid_utf8_on_stdin_does_not_kill_the_input_thread():
    import os

    from chat_app.terminal import driver_class

    cls = driver_class()
    if cls is None:
        pytest.skip("Textual's own driver on this platform")
    seen = []

    class Probe(cls):
        def __init__(self, fd):  # only what run_input_thread touches
            self.fileno, self._debug = fd, False
            import threading

            self.exit_event = threading.Event()

        def process_message(self, message):
            seen.append(message)
            if len(seen) >= 3:
                self.exit_event.set()

    r, w = os.pipe()
    os.write(w, b"a\xff\xfeb")
    probe = Probe(r)
    probe.run_input_thread()
    os.close(w)
    os.close(r)
    assert [getattr(e, "character", None) for e in seen[:3]] == ["a", "\ufffd", "\ufffd"] or \
        "b" in [getattr(e, "character", None) for e in seen]


# ---- 9. /export refuses to overwrite ---------------------------------------------------------

async def test_export_refuses_to_overwrite_unless_told(make_app, tmp_path):
    app = make_app("--max-tokens", "5")
    out = tmp_path / "chat.md"
    out.write_text("precious")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        await send(pilot, f"/export {out}")
        await wait_until(pilot, lambda: any("exists" in e and "/export!" in e for e in errors(app)), what="the refusal")
        assert out.read_text() == "precious"
        await send(pilot, f"/export! {out}")
        await wait_until(pilot, lambda: any("Exported" in n for n in notices(app)), what="the export")
        assert "## You\n\nHello" in out.read_text()
