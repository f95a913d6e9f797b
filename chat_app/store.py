"""Store: conversations saved as they happen, in SQLite, and never lost to a broken disk.

Where: `$TINYLLM_CHAT_DATA_DIR` if set (tests point it at a tmp dir), else
`platformdirs.user_data_dir("tinyllm-chat")`; the file is `chat.db`.

Contract:
- One row per conversation (model name, system prompt, created time) and one per message
  (role, content, stopped, partial). A conversation row is written with its first message,
  so an empty chat leaves nothing behind. Rows are addressed by their own id, never by
  "the newest row".
- Memory first: the open conversation lives in `self.chat` (a list of `Saved`); every change
  is made there and then written (`sync`). A failed write raises `StoreError` with a
  one-line message that says where the file is and what to do; nothing is dropped: the
  next write (or `retry()`) writes everything still pending, after reconnecting. The app
  shows the error and keeps the conversation; `export_markdown` works from memory, so a
  chat can be saved elsewhere while the database is broken.
- A reply is added as `partial` when it starts and updated while it streams, so a crash
  (kill -9) loses at most the text since the last update; `finish` clears the mark.
- One instance per conversation: a conversation is held through an advisory lock file
  (`locks/<id>.lock`, `fcntl.flock`, released by the OS when the process dies);
  `resume_last` skips a conversation another instance holds.
- SQLite runs in WAL mode with a busy timeout, so two instances on one folder wait briefly
  for each other instead of failing. The store is used from the UI thread only.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one instance per conversation is not enforced
    fcntl = None  # type: ignore[assignment]

ENV_DIR = "TINYLLM_CHAT_DATA_DIR"
BUSY_TIMEOUT_MS = 2000
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    model TEXT NOT NULL,
    system TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stopped INTEGER NOT NULL DEFAULT 0
);
"""


class StoreError(Exception):
    """A read or write of chat.db failed; the message says where it is and what to do."""


@dataclass(eq=False)
class Saved:
    role: str  # "user" | "assistant"
    content: str
    stopped: bool = False  # a reply cut short with Esc
    partial: bool = False  # a reply still streaming (or cut by a crash)
    id: int | None = field(default=None, repr=False)  # its row, once written
    dirty: bool = field(default=True, repr=False)  # changed since the last write


@dataclass(eq=False)
class _Chat:
    messages: list[Saved] = field(default_factory=list)
    system: str | None = None
    id: int | None = None
    deleted: list[int] = field(default_factory=list)  # rows to delete at the next write
    system_dirty: bool = False
    lock: IO | None = None


def default_data_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tinyllm-chat"))


def advice(path: Path, e: Exception) -> str:
    """One line: what went wrong with the file at `path`, and what to do about it."""
    text = str(e)
    low = text.lower()
    if "readonly" in low or "read-only" in low or "permission" in low:
        todo = f"make it writable (chmod u+w {path}) or set {ENV_DIR} to another folder"
    elif "malformed" in low or "not a database" in low or "corrupt" in low:
        todo = f"move it away (mv {path} {path}.broken) and restart to begin a fresh history"
    elif "full" in low or "no space" in low:
        todo = "free some disk space"
    elif "locked" in low or "busy" in low:
        todo = "another program holds it; close that program"
    else:
        todo = f"check the file, or set {ENV_DIR} to another folder"
    return f"chat history {path}: {text}; {todo}. The chat is kept in memory (/export PATH saves it)"


class Store:
    def __init__(self, path: str | Path, model: str = "model", system: str | None = None):
        self.path = Path(path)
        self.model = model
        self.chat = _Chat(system=system)
        self._older: list[_Chat] = []  # earlier chats of this run with writes still pending
        self.db: sqlite3.Connection | None = None
        self.error: str | None = None  # the last failure, None once writes work again
        try:
            self._connect()
        except sqlite3.Error as e:  # the app starts anyway and shows this
            self.error = advice(self.path, e)

    @classmethod
    def open(cls, data_dir: str | Path | None = None, model: str = "model",
             system: str | None = None) -> Store:
        """Open (creating) chat.db in data_dir; an unusable folder is a ValueError. A chat.db
        that cannot be opened is not: the store starts with `error` set and retries later."""
        folder = Path(data_dir) if data_dir else default_data_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot open the chat history in {folder} ({e}); "
                             f"set {ENV_DIR} to a writable folder") from None
        return cls(folder / "chat.db", model, system)

    def _connect(self) -> None:
        self._disconnect()
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            try:
                db.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError:
                pass  # a read-only file: the first write says so
            db.executescript(SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
            if "partial" not in columns:  # a chat.db from before partial replies
                db.execute("ALTER TABLE messages ADD COLUMN partial INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error:
            db.close()
            raise
        self.db = db

    def close(self) -> None:
        """Close the file and let go of the conversations this store holds."""
        self._disconnect()
        for chat in (*self._older, self.chat):
            self._release(chat)

    def _disconnect(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def system(self) -> str | None:
        return self.chat.system

    @property
    def conversation(self) -> int | None:
        """The open conversation's row id; None until its first message is written."""
        return self.chat.id

    @property
    def pending(self) -> bool:
        """Something changed in memory is not in chat.db yet."""
        return any(self._unwritten(c) for c in (*self._older, self.chat))

    # ---- writing (memory first, then `sync`) -------------------------------------------

    def new_chat(self) -> None:
        if self._unwritten(self.chat):
            self._older.append(self.chat)  # written with the next successful sync
        else:
            self._release(self.chat)
        self.chat = _Chat(system=self.chat.system)

    def add(self, message: Saved) -> None:
        """Append a message (the caller keeps it, to `update` or `drop` it later)."""
        self.chat.messages.append(message)
        self.sync()

    def update(self, message: Saved, content: str, partial: bool = True, stopped: bool = False) -> None:
        """A streaming reply grew (partial) or ended (partial=False)."""
        message.content, message.partial, message.stopped, message.dirty = content, partial, stopped, True
        self.sync()

    def drop(self, message: Saved) -> None:
        """Forget one message (a reply being regenerated): by its own row id."""
        if message in self.chat.messages:
            self.chat.messages.remove(message)
            if message.id is not None:
                self.chat.deleted.append(message.id)
            self.sync()

    def set_system(self, text: str | None) -> None:
        self.chat.system, self.chat.system_dirty = text or None, True
        self.sync()

    def retry(self) -> None:
        """Write what is pending (StoreError if it still fails)."""
        self.sync()

    def sync(self) -> None:
        """Write every pending change, each chat in one transaction. StoreError when it fails."""
        try:
            if self.db is None:
                self._connect()
            for chat in (*self._older, self.chat):
                if self._unwritten(chat):
                    self._write(chat)
        except sqlite3.Error as e:
            self.error = advice(self.path, e)
            self._disconnect()  # reconnect on the next try: a moved, fixed or freed file may work then
            raise StoreError(self.error) from e
        self.error = None
        for chat in self._older:
            self._release(chat)
        self._older = []

    @staticmethod
    def _unwritten(chat: _Chat) -> bool:
        return bool(chat.deleted or (chat.messages and (chat.id is None or chat.system_dirty))
                    or any(m.dirty for m in chat.messages))

    def _write(self, chat: _Chat) -> None:
        assert self.db is not None
        db, new_id = self.db, None
        db.execute("BEGIN IMMEDIATE")
        try:
            if chat.id is None:
                cur = db.execute("INSERT INTO conversations (created, model, system) VALUES (?, ?, ?)",
                                 (time.time(), self.model, chat.system))
                new_id = cur.lastrowid
                assert new_id is not None
                chat.lock = self._claim(new_id)  # held before anyone else can see it
            elif chat.system_dirty:
                db.execute("UPDATE conversations SET system = ? WHERE id = ?", (chat.system, chat.id))
            cid = chat.id if new_id is None else new_id
            for row in chat.deleted:
                db.execute("DELETE FROM messages WHERE id = ? AND conversation = ?", (row, cid))
            ids: list[tuple[Saved, int]] = []
            for m in chat.messages:
                if m.id is None:
                    cur = db.execute("INSERT INTO messages (conversation, role, content, stopped, partial) "
                                     "VALUES (?, ?, ?, ?, ?)", (cid, m.role, m.content, int(m.stopped),
                                                                int(m.partial)))
                    assert cur.lastrowid is not None
                    ids.append((m, cur.lastrowid))
                elif m.dirty:
                    db.execute("UPDATE messages SET content = ?, stopped = ?, partial = ? WHERE id = ?",
                               (m.content, int(m.stopped), int(m.partial), m.id))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if new_id is not None and chat.lock is not None:
                self._release(chat)
            raise
        if new_id is not None:
            chat.id = new_id
        for m, row in ids:
            m.id = row
        for m in chat.messages:
            m.dirty = False
        chat.deleted, chat.system_dirty = [], False

    # ---- one instance per conversation ---------------------------------------------------

    def _claim(self, conversation: int) -> IO | None:
        """The lock of a conversation, or None when another instance holds it."""
        if fcntl is None:
            return open(os.devnull)  # noqa: SIM115 (no locks on this platform)
        locks = self.folder / "locks"
        locks.mkdir(exist_ok=True)
        f = open(locks / f"{conversation}.lock", "a")  # noqa: SIM115 (held while the chat is open)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        return f

    @staticmethod
    def _release(chat: _Chat) -> None:
        if chat.lock is not None:
            chat.lock.close()
            chat.lock = None

    # ---- reading -----------------------------------------------------------------------

    def resume_last(self) -> tuple[list[Saved], bool]:
        """Continue the most recent conversation with messages that no other instance holds:
        (its messages, whether a newer one was skipped because another instance holds it).
        StoreError when the file cannot be read."""
        try:
            if self.db is None:
                self._connect()
            assert self.db is not None
            rows = self.db.execute("SELECT c.id, c.system FROM conversations c JOIN messages m "
                                   "ON m.conversation = c.id GROUP BY c.id ORDER BY MAX(m.id) DESC").fetchall()
            held = False
            for cid, system in rows:
                lock = self._claim(cid)
                if lock is None:
                    held = True
                    continue
                found = self.db.execute("SELECT id, role, content, stopped, partial FROM messages "
                                        "WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
                self._release(self.chat)
                self.chat = _Chat([Saved(role, content, bool(stopped), bool(partial), row, dirty=False)
                                   for row, role, content, stopped, partial in found],
                                  system, cid, lock=lock)
                return list(self.chat.messages), held
            return [], held
        except sqlite3.Error as e:
            self.error = advice(self.path, e)
            self._disconnect()
            raise StoreError(self.error) from e

    def messages(self) -> list[Saved]:
        return list(self.chat.messages)

    def export_markdown(self, path: str | Path, overwrite: bool = False) -> int:
        """Write the conversation (from memory, so it works while chat.db is broken) as
        Markdown; returns how many messages were written. An existing file is refused
        (FileExistsError) unless `overwrite`."""
        saved = self.chat.messages
        parts = [f"# Chat with {self.model}\n"]
        if self.chat.system:
            parts.append(f"**System:** {self.chat.system}\n")
        for m in saved:
            who = "You" if m.role == "user" else self.model
            note = "\n\n*(stopped)*" if m.stopped else "\n\n*(unfinished)*" if m.partial else ""
            parts.append(f"## {who}\n\n{m.content.strip()}{note}\n")
        with open(Path(path).expanduser(), "w" if overwrite else "x", encoding="utf-8") as f:
            f.write("\n".join(parts))
        return len(saved)
