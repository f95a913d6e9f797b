"""Issue 31, section 3: store, lock and file faults. A read-only chat.db (and the advice that
fixes it), chat.db deleted or replaced while the app runs, a locks folder that cannot be used,
/export to a FIFO, rows that are not text. Each test fails without its fix.

The tests may run as root, which ignores file permissions: a read-only chat.db is then made
by opening it the way SQLite opens a file it may not write (`mode=ro`), which gives SQLite's own
"attempt to write a readonly database". Every other fault here is a real one (a file where a
folder belongs, a deleted file, a FIFO, a BLOB in a row)."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from chat_app.store import Saved, Store, StoreError
from chat_app.widgets.chat_list import ChatList
from chat_app.widgets.conversation import UserMessage
from tests.chat_app.conftest import loaded, notices, rows, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def errors(app) -> list[str]:
    """Error toasts (a store that cannot write), and the notes of refused commands (/export's)."""
    from chat_app.widgets.system_note import SystemNote

    return [n.message for n in app._notifications if n.severity == "error"] + [
        n.text for n in app.query(SystemNote) if n.severity == "error"]


def warnings(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "warning"]


@pytest.fixture
def read_only(monkeypatch):
    """chat.db files that SQLite may read but not write, while `on` holds True."""
    state = {"on": False}
    real = sqlite3.connect

    def connect(path, *args, **kwargs):
        if state["on"] and Path(path).name == "chat.db":
            return real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    return state


# ---- 1. a read-only chat.db: said each time, kept in memory, written once it works, never lost at quit

async def test_read_only_store_is_said_again_written_later_and_rescued_at_quit(make_app, data_dir, read_only):
    store = Store.open(data_dir)
    store.add(Saved("user", "from an earlier run"))
    store.close()
    read_only["on"] = True
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "one")
        told = [e for e in errors(app) if "readonly" in e]
        assert len(told) == 1, errors(app)  # once for the message (its prompt, user row and reply all fail)
        for name in ("chat.db", "chat.db-wal", "chat.db-shm"):  # the files the advice names
            assert str(data_dir / name) in told[0]
        await send(pilot, "two")
        assert len([e for e in errors(app) if "readonly" in e]) == 2  # the next message fails too: said again
        read_only["on"] = False  # what the advice said to do
        await send(pilot, "three")
        assert not app.store.pending and any("saved again" in n for n in notices(app))
        assert [r[3] for r in rows(data_dir)][1::2] == ["one", "two", "three"]  # after the earlier run's row


async def test_quitting_with_messages_chat_db_lacks_writes_them_to_a_file_and_says_where(make_app, data_dir,
                                                                                        read_only):
    Store.open(data_dir).close()
    read_only["on"] = True
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        assert app.store.pending
    assert app.farewell and str(data_dir) in app.farewell  # one line naming the file
    unsaved = list(data_dir.glob("unsaved-*.md"))
    assert len(unsaved) == 1 and unsaved[0].name in app.farewell
    text = unsaved[0].read_text()
    assert "\none\n" in text and "\ntwo\n" in text  # the whole conversation, replies too
    assert text.count("## ") == 4


def test_rescue_falls_back_to_the_current_then_the_temp_folder_and_says_when_it_cannot(tmp_path, monkeypatch):
    from chat_app.store_advice import rescue

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    store = Store(not_a_folder / "chat.db")  # a data folder that is a file: nothing can be written there
    assert store.error
    with pytest.raises(StoreError):
        store.add(Saved("user", "keep me"))
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    line = store.rescue()
    assert line and str(here) in line and "keep me" in next(here.glob("unsaved-*.md")).read_text()
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # the current directory no longer exists
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    assert str(temp) in rescue("text", not_a_folder)
    monkeypatch.setattr("tempfile.tempdir", str(not_a_folder))
    line = rescue("text", not_a_folder)
    assert "could not" in line and "lost" in line


@pytest.mark.parametrize("fails_at", ["write", "close"])
def test_rescue_on_a_full_disk_leaves_no_empty_file_behind(tmp_path, monkeypatch, fails_at):
    """Issue 52, defect 4: quitting with chat.db unwritable on a full disk left a 0-byte
    unsaved-*.md in the full data folder (the copy itself went to the current folder, as the line
    said). ENOSPC at the write, or at the close that flushes it: nothing is left in that folder."""
    import errno

    from chat_app import store_advice

    full = tmp_path / "data"  # the full disk
    full.mkdir()
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    real_open = open

    class FullDisk:
        """A file on the full disk: made (as O_CREAT makes it, 0 bytes), then no room for its text."""
        def __init__(self, f):
            self.f = f

        def write(self, text):
            if fails_at == "write":
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(text)  # buffered; the flush at close finds no room

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
            if fails_at == "close" and exc[0] is None:
                raise OSError(errno.ENOSPC, "No space left on device")

    def open_on_a_full_disk(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        return FullDisk(f) if Path(path).parent == full else f

    monkeypatch.setattr(store_advice, "open", open_on_a_full_disk, raising=False)
    line = store_advice.rescue("keep me", full)
    [copy] = here.glob("unsaved-*.md")
    assert str(copy) in line and copy.read_text() == "keep me"
    assert list(full.iterdir()) == [], "no file, empty or cut short, in the full folder"


# ---- 2. chat.db deleted or replaced while the app runs -------------------------------------------

async def test_chat_db_deleted_while_running_is_written_again(make_app, data_dir):
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "before")
        for f in data_dir.glob("chat.db*"):
            f.unlink()  # rm chat.db*
        await send(pilot, "after")
        assert not app.store.pending and not errors(app)
        assert len([w for w in warnings(app) if "deleted" in w]) == 1
    assert [m.content for m in saved_chat(data_dir)][::2] == ["before", "after"]


def test_chat_db_replaced_while_open_gets_the_whole_chat(tmp_path):
    store = Store.open(tmp_path)
    store.add(Saved("user", "one"))
    store.add(Saved("assistant", "reply"))
    fresh = tmp_path / "fresh.db"
    sqlite3.connect(fresh).close()
    os.replace(fresh, tmp_path / "chat.db")  # a backup put back, say: another file at the same path
    store.add(Saved("user", "two"))
    assert [r[3] for r in rows(tmp_path)] == ["one", "reply", "two"] and len(store.notices) == 1
    store.close()


# ---- 3. a locks folder that cannot be used ------------------------------------------------------

async def test_locks_a_plain_file_is_a_notice_and_the_chat_is_saved_unlocked(make_app, data_dir):
    data_dir.mkdir()
    (data_dir / "locks").write_text("not a folder")
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello")
        await send(pilot, "again")
        assert app.is_running and [w.text for w in app.query(UserMessage)] == ["hello", "again"]
        said = [w for w in warnings(app) if "locks" in w]
        assert len(said) == 1 and "without a lock" in said[0] and "rm " in said[0], warnings(app)
    assert [m.content for m in saved_chat(data_dir)][::2] == ["hello", "again"]


def test_a_lock_file_that_cannot_be_opened_leaves_the_chat_unlocked(tmp_path):
    (tmp_path / "locks" / "1.lock").mkdir(parents=True)  # open() fails: IsADirectoryError
    store = Store.open(tmp_path)
    store.add(Saved("user", "kept"))
    assert [r[3] for r in rows(tmp_path)] == ["kept"] and len(store.notices) == 1
    store.close()


# ---- 4. /export to something that is not a regular file -------------------------------------------

async def test_export_refuses_a_fifo_a_device_and_a_folder_and_writes_on_a_worker(make_app, tmp_path, monkeypatch):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # Only if the UI froze on the FIFO (the bug): something reads it after a while, so the test
    # fails on its asserts instead of hanging. A passing run never waits on it.
    unfreeze = threading.Timer(60, lambda: open(fifo, "rb").read())
    unfreeze.daemon = True
    unfreeze.start()
    import chat_app.commands as commands
    from chat_app.commands import shortened

    threads = []
    real = commands.write_regular

    def write(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(commands, "write_regular", write, raising=False)  # (raising: before the fix, the UI froze)
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello")
        for target in (fifo, "/dev/null", tmp_path):
            await send(pilot, f"/export! {target}")
            await wait_until(pilot, lambda t=target: any(shortened(str(t)) in e for e in errors(app)),
                             what=f"refused {target}")  # a long path is shortened: one line (issue 46, item 7)
        unfreeze.cancel()
        assert all("not a regular file" in e for e in errors(app)), errors(app)
        await send(pilot, f"/export {tmp_path / 'chat.md'}")
        await wait_until(pilot, lambda: any("Exported 2 messages" in n for n in notices(app)))
    assert "hello" in (tmp_path / "chat.md").read_text()
    assert threads and all(t is not threading.main_thread() for t in threads)


# ---- 5. rows that are not text ------------------------------------------------------------------

async def test_rows_that_are_not_text_are_skipped_on_resume_and_in_the_chat_list(make_app, data_dir):
    store = Store.open(data_dir)
    for role, text in [("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")]:
        store.add(Saved(role, text))
    store.new_chat()
    store.add(Saved("user", "Another chat"))
    store.close()
    with sqlite3.connect(data_dir / "chat.db") as db:
        db.execute("UPDATE messages SET content = X'FFFE41' WHERE content = 'A1'")
        db.execute("UPDATE conversations SET title = X'FFFE41', model = 7 WHERE id = 2")
        db.execute("INSERT INTO messages (conversation, role, content) VALUES (1, 'user', X'')")  # a number: as text

        db.execute("INSERT INTO messages (conversation, role, content) VALUES (1, X'00', 'bad role')")
        db.execute("INSERT INTO prompts (text) VALUES (X'FFFE41')")
        db.execute("UPDATE conversations SET updated = updated + 60 WHERE id = 1")  # written last, as by hand
    app = make_app("--max-tokens", "4", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 4, what="the resumed chat")
        assert [w.text for w in app.query(UserMessage)] == ["Q1", "Q2"]
        assert any("Skipped 3 unreadable" in w for w in warnings(app)), warnings(app)
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, ChatList)
        titles = [c.title for c in app.screen.chats]
        assert titles == ["Q1", "Another chat"], titles  # a BLOB title: the first message instead
        await pilot.press("escape")
        await send(pilot, "Still works")
        assert app.is_running and not errors(app)
