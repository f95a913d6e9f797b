"""Store: conversations saved as they happen, in SQLite, and never lost to a broken disk.

Where: `$TINYLLM_CHAT_DATA_DIR` if set (tests point it at a tmp dir), else
`platformdirs.user_data_dir("tinyllm-chat")`; the file is `chat.db`.

Contract:
- One row per conversation (model name, the system prompt it started with, created and
  updated times, a title the user gave it or none, the /set values it was given, and where
  its model is: `model_path`, the model's resolved local path, and `model_spec`, the
  `hf:OWNER/REPO[:FILE]` it was named by where it came from the Hub; set on the store by the
  app for the model open, read back as `chat_model_path` / `chat_model_spec`) and one per
  message (role, content, stopped, partial, and for a reply the model that wrote it). A system
  prompt set after the first message is a message of role "system" where it was set (text ""
  clears it); `system` is the one in force. A chat is a tree (chat_app.branches): each
  message row names its `parent` (0: the chat's first), the conversation row its `leaf`, and
  `messages()` is the branch that ends there (what the screen, the model, the export and a
  resumed chat see). `add` continues the branch; `drop(m)` takes back its last message (a
  message sent that the session refused before its reply began); `branch(m)` goes back to just before `m`, so
  the next `add` is another version of it (Ctrl+R, an edit: the old one stays; an empty reply
  goes); `switch(m)` shows the branch through another version (on through its newest
  replies); `versions(m)` says which of how many. Rows from before chat.db kept parents get
  them inferred when read (an edit's `replaced` rows beside the edit). A conversation row is written with its first
  message, so an empty chat leaves nothing behind. Rows are addressed by their own id, never
  by "the newest row". Older chat.db files gain the new columns when opened.
- `chats()` lists the saved conversations (newest first); `open_chat(id)` makes one the open
  conversation; `rename` and `delete` change any that no other instance holds. Prompts typed
  are kept in their own table (`add_prompt`, `prompts()`): the input's history across runs.
- Memory first: the open conversation lives in `self.chat` (a list of `Saved`); every change
  is made there and then written (`sync`). A failed write raises `StoreError` with a
  one-line message that says where the file is and what to do (chat_app.store_advice);
  nothing is dropped: the next write (or `retry()`) writes everything still pending, after
  reconnecting. The app shows the error and keeps the conversation; `export_markdown` works
  from memory, so a chat can be saved elsewhere while the database is broken, and at quit
  `rescue()` writes what chat.db still lacks to an unsaved-*.md file and says where.
- A chat.db deleted or replaced while open (its device and inode changed) is found at the
  next read or write: it is opened again (made anew, the data folder too) and every chat this
  store holds is written into it whole. What the app should say about it is in `notices`.
- `resume()`: `resume_last` as a `Resumed` (its messages, whether a newer chat is held, the
  error that stopped it), for --resume to see the chat's model before the app opens it.
- A row that is not text where text belongs (a BLOB put there by hand) is skipped when a chat
  is opened (`skipped` counts them) and read as empty in the chat list; never a crash.
- A reply is added as `partial` when it starts and updated while it streams, so a crash
  (kill -9) loses at most the text since the last update; `finish` clears the mark.
- One instance per conversation: a conversation is held through an advisory lock file
  (chat_app.locks: `locks/<id>.lock`, released by the OS when the process dies);
  `resume_last` skips a conversation another instance holds. Where no lock can be taken (a
  file named locks, no permission) the chat is saved unlocked, and `notices` says so once.
- SQLite runs in WAL mode with a busy timeout, so two instances on one folder wait briefly
  for each other instead of failing. The store is used from the UI thread only.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from chat_app.branches import newest_leaf, path, tree, versions
from chat_app.history import History, markdown
from chat_app.locks import claim, unlocked
from chat_app.rows import Chat, Saved, StoreError  # noqa: F401 (Saved, StoreError: the store's, for its users)
from chat_app.store_advice import ENV_DIR, advice, identity, lock_advice, rescue

BUSY_TIMEOUT_MS = 2000
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    model TEXT NOT NULL,
    system TEXT,
    title TEXT,
    settings TEXT,
    updated REAL,
    model_path TEXT,
    model_spec TEXT,
    leaf INTEGER
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stopped INTEGER NOT NULL DEFAULT 0,
    partial INTEGER NOT NULL DEFAULT 0,
    model TEXT,
    replaced INTEGER NOT NULL DEFAULT 0,
    parent INTEGER
);
CREATE TABLE IF NOT EXISTS prompts (
    id INTEGER PRIMARY KEY,
    text TEXT NOT NULL
);
"""
# The chat list's page (chat_app.history.chats) walks conversations newest first through an index
# and counts each shown chat's messages through the other: at 100,000 chats, without them, the
# list took about 5 minutes to open. Made where they are missing, once (a read-only chat.db: not).
INDEXES = """
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE INDEX IF NOT EXISTS conversations_by_time ON conversations(COALESCE(updated, created));
"""
ADDED = {"messages": {"partial": "INTEGER NOT NULL DEFAULT 0", "model": "TEXT",  # columns newer than
                      "replaced": "INTEGER NOT NULL DEFAULT 0", "parent": "INTEGER"},
         "conversations": {"title": "TEXT", "settings": "TEXT", "updated": "REAL",  # the first chat.db
                           "model_path": "TEXT", "model_spec": "TEXT", "leaf": "INTEGER"}}


def default_data_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tinyllm-chat"))


@dataclass
class Resumed:
    """What --resume found (Store.resume), before the app opens it."""
    saved: list[Saved]  # the chat's messages ([]: none to resume)
    held: bool = False  # a newer chat was skipped: another instance holds it
    error: str | None = None  # chat.db could not be read
    notice: str | None = None  # about its model (gone: the chat goes on with another)


class Store(History):
    def __init__(self, path: str | Path, model: str = "model", system: str | None = None):
        self.path = Path(path)
        self.model = model  # the open model's name, path and Hub spec: what a new chat is saved with
        self.model_path: str | None = None
        self.model_spec: str | None = None
        self.chat = Chat(system=system)
        self._older: list[Chat] = []  # earlier chats of this run with writes still pending
        self.db: sqlite3.Connection | None = None
        self.error: str | None = None  # the last failure, None once writes work again
        self.notices: list[str] = []  # what the app should say (a lost chat.db, no locks); it empties it
        self.skipped = 0  # rows of the chat last opened that could not be read (not text)
        self._identity: tuple[int, int] | None = None  # the chat.db file the connection has open
        self._unlocked_said = False
        try:
            self._connect()
        except (sqlite3.Error, OSError) as e:  # the app starts anyway and shows this
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
        self.folder.mkdir(exist_ok=True)  # the data folder deleted while the app ran: made again
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            try:
                db.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError:
                pass  # a read-only file: the first write says so
            db.executescript(SCHEMA)
            for table, added in ADDED.items():
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for name, kind in added.items():
                    if name not in columns:  # a chat.db from before this column
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            try:
                db.executescript(INDEXES)
            except sqlite3.OperationalError:
                pass  # a read-only file: the list is slower, and the first write says why
        except sqlite3.Error:
            db.close()
            raise
        self.db, self._identity = db, identity(self.path)

    def _ensure(self) -> None:
        """Connect if not connected. A chat.db deleted or replaced since it was opened is opened
        again (made anew) and every chat this store holds is marked to be written whole."""
        if self.db is not None and identity(self.path) != self._identity:
            self._disconnect()
            for chat in (*self._older, self.chat):
                self._release(chat)  # its new row gets its own lock
                chat.id, chat.deleted, chat.meta_dirty = None, [], True
                for m in chat.messages:
                    m.id, m.dirty = None, True
            self.notices.append(f"{self.path} was deleted or replaced while open; "
                                "this run's open chat is saved again in a new one")
        if self.db is None:
            self._connect()

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
        """The system prompt in force in the open conversation."""
        return self.chat.current_system

    @property
    def chat_model(self) -> str:
        """The model the open conversation started with (replies saved before each reply
        kept its own)."""
        return self.chat.model or self.model

    @property
    def chat_model_path(self) -> str | None:
        """Where the open conversation's model is (None: a chat.db from before this was kept)."""
        return self.chat.model_path if self.chat.id is not None else self.model_path

    @property
    def chat_model_spec(self) -> str | None:
        """The hf: spec the open conversation's model came by (None: not from the Hub)."""
        return self.chat.model_spec if self.chat.id is not None else self.model_spec

    @property
    def settings(self) -> dict[str, str]:
        """The open conversation's /set values (name: value as typed)."""
        return dict(self.chat.settings)

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
        self.chat = Chat(system=self.chat.current_system, settings=dict(self.chat.settings))

    def add(self, message: Saved) -> None:
        """Continue the branch shown with a message (the caller keeps it, to `update` it later)."""
        message.parent, self.chat.leaf, self.chat.meta_dirty = self.chat.leaf, message, True
        self.chat.messages.append(message)
        self.sync()

    def drop(self, message: Saved) -> None:
        """Take back the branch's last message, which nothing follows (a message sent and saved
        that the session refused before its reply began): gone from memory and from chat.db."""
        chat = self.chat
        if message is not chat.leaf or any(m.parent is message for m in chat.messages):
            return
        chat.leaf, chat.meta_dirty = message.parent, True
        chat.messages.remove(message)
        if message.id is not None:
            chat.deleted.append(message.id)
        self.sync()

    def update(self, message: Saved, content: str, partial: bool = True, stopped: bool = False) -> None:
        """A streaming reply grew (partial) or ended (partial=False)."""
        message.content, message.partial, message.stopped, message.dirty = content, partial, stopped, True
        self.sync()

    def branch(self, message: Saved) -> None:
        """The branch shown goes back to just before `message` (on it), so the next `add` is
        another version of it; `message` stays, one version among them, unless it is a reply
        with no text and nothing after it (a reply that never began): that one goes."""
        chat = self.chat
        if message not in path(chat.leaf):
            return
        chat.leaf, chat.meta_dirty = message.parent, True
        if message.role == "assistant" and not message.content and all(m.parent is not message for m in chat.messages):
            chat.messages.remove(message)
            if message.id is not None:
                chat.deleted.append(message.id)
        self.sync()

    def switch(self, message: Saved) -> list[Saved]:
        """Show the branch through `message` (a message of this chat), on through its newest
        replies to their end; the messages shown."""
        self.chat.leaf, self.chat.meta_dirty = newest_leaf(message, self.chat.messages), True
        self.sync()
        return self.messages()

    def versions(self, message: Saved) -> list[Saved]:
        """`message` and its other versions (one parent, one role), oldest first."""
        return versions(message, self.chat.messages)

    def set_system(self, text: str | None) -> None:
        """Before the first message: the chat starts with it; after: a system row, here."""
        if any(m.role != "system" for m in self.chat.messages):
            self.add(Saved("system", text or ""))
        else:
            self.chat.messages, self.chat.leaf = [], None
            self.chat.system, self.chat.meta_dirty = text or None, True
            self.sync()

    def set_setting(self, name: str, value: str) -> None:
        settings = self.chat.settings
        settings.pop(name, None)
        settings[name] = value
        self.chat.meta_dirty = True
        self.sync()

    def drop_setting(self, name: str) -> None:
        """Forget one /set value (a saved one no reply can use)."""
        if self.chat.settings.pop(name, None) is not None:
            self.chat.meta_dirty = True
            self.sync()

    def retry(self) -> None:
        """Write what is pending (StoreError if it still fails)."""
        self.sync()

    def sync(self) -> None:
        """Write every pending change, each chat in one transaction. StoreError when it fails."""
        try:
            self._ensure()
            for chat in (*self._older, self.chat):
                if self._unwritten(chat):
                    self._write(chat)
        except (sqlite3.Error, OSError) as e:
            self.error = advice(self.path, e)
            self._disconnect()  # reconnect on the next try: a moved, fixed or freed file may work then
            raise StoreError(self.error) from e
        self.error = None
        for chat in self._older:
            self._release(chat)
        self._older = []

    @staticmethod
    def _unwritten(chat: Chat) -> bool:
        return bool(chat.deleted or (chat.messages and (chat.id is None or chat.meta_dirty))
                    or any(m.dirty for m in chat.messages))

    def _write(self, chat: Chat) -> None:
        assert self.db is not None
        db, new_id = self.db, None
        db.execute("BEGIN IMMEDIATE")
        try:
            if chat.id is None:
                cur = db.execute("INSERT INTO conversations (created, model, system, model_path, model_spec) "
                                 "VALUES (?, ?, ?, ?, ?)",
                                 (time.time(), self.model, chat.system, self.model_path, self.model_spec))
                new_id = cur.lastrowid
                assert new_id is not None
                chat.lock = self._claim(new_id)  # held before anyone else can see it
            cid = chat.id if new_id is None else new_id
            for row in chat.deleted:
                db.execute("DELETE FROM messages WHERE id = ? AND conversation = ?", (row, cid))
            ids: dict[int, tuple[Saved, int]] = {}  # id(message): its new row (a parent before its replies)

            def row_of(m: Saved | None) -> int:  # 0: none (the chat's first message; an empty chat's leaf)
                return 0 if m is None else m.id if m.id is not None else ids[id(m)][1]
            for m in chat.messages:
                if m.id is None:
                    cur = db.execute("INSERT INTO messages (conversation, role, content, stopped, partial, model, "
                                     "parent) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     (cid, m.role, m.content, int(m.stopped), int(m.partial), m.model, row_of(m.parent)))
                    assert cur.lastrowid is not None
                    ids[id(m)] = m, cur.lastrowid
                elif m.dirty:
                    db.execute("UPDATE messages SET content = ?, stopped = ?, partial = ? WHERE id = ?",
                               (m.content, int(m.stopped), int(m.partial), m.id))
            db.execute("UPDATE conversations SET system = ?, settings = ?, updated = ?, leaf = ? WHERE id = ?",
                       (chat.system, json.dumps(chat.settings), time.time(), row_of(chat.leaf), cid))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if new_id is not None and chat.lock is not None:
                self._release(chat)
            raise
        if new_id is not None:
            chat.id = new_id
        for m, row in ids.values():
            m.id = row
        for m in chat.messages:
            m.dirty = False
        chat.deleted, chat.meta_dirty = [], False

    # ---- one instance per conversation ---------------------------------------------------

    def _claim(self, conversation: int) -> IO | None:
        """The lock of a conversation, or None when another instance holds it."""
        try:
            return claim(self.folder / "locks", conversation)
        except OSError as e:  # no lock possible (a file named locks, no permission): the chat goes on unlocked
            if not self._unlocked_said:
                self._unlocked_said = True
                self.notices.append(lock_advice(self.folder / "locks", e))
            return unlocked()

    @staticmethod
    def _release(chat: Chat) -> None:
        if chat.lock is not None:
            chat.lock.close()
            chat.lock = None

    # ---- reading, and the other conversations ---------------------------------------------

    def _read(self, work):
        """Run work(db) on the connection; a failure is a StoreError (and a reconnect later)."""
        try:
            self._ensure()
            assert self.db is not None
            return work(self.db)
        except (sqlite3.Error, OSError) as e:
            self.error = advice(self.path, e)
            self._disconnect()
            raise StoreError(self.error) from e

    def resume_last(self) -> tuple[list[Saved], bool]:
        """Continue the most recently written conversation with messages (the chat list's first)
        that no other instance holds:
        (its messages, whether a newer one was skipped because another instance holds it).
        StoreError when the file cannot be read."""
        def work(db):
            held = False
            for (cid,) in db.execute("SELECT c.id FROM conversations c WHERE EXISTS (SELECT 1 FROM messages m "
                                     "WHERE m.conversation = c.id) "  # the chat list's order (History.chats)
                                     "ORDER BY COALESCE(c.updated, c.created) DESC, c.id DESC").fetchall():
                lock = self._claim(cid)
                if lock is None:
                    held = True
                    continue
                return self._load(db, cid, lock), held
            return [], held
        return self._read(work)

    def resume(self) -> Resumed:
        """resume_last, its StoreError as `error`."""
        try:
            return Resumed(*self.resume_last())
        except StoreError as e:
            return Resumed([], error=f"could not resume: {e}")

    def open_chat(self, cid: int) -> list[Saved]:
        """Make conversation `cid` the open one (the current one stays saved): its messages.
        ValueError when another instance holds it or it is gone; StoreError when unreadable."""
        if cid == self.chat.id:
            return self.messages()

        def work(db):
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (cid,)).fetchone() is None:
                raise ValueError(f"chat {cid} is not in the history any more")
            lock = self._claim(cid)
            if lock is None:
                raise ValueError("that chat is open in another tinyllm-chat")
            self.new_chat()  # the current one: written (or released) as new_chat does
            return self._load(db, cid, lock)
        return self._read(work)

    def _load(self, db: sqlite3.Connection, cid: int, lock: IO | None) -> list[Saved]:
        """Conversation `cid` becomes the open one; a row that is not text (a BLOB, a number,
        NULL: a chat.db edited by hand) is skipped and counted in `skipped`."""
        system, settings, model, where, spec, leaf = db.execute(
            "SELECT system, settings, model, model_path, model_spec, leaf FROM conversations WHERE id = ?",
            (cid,)).fetchone()
        found = db.execute("SELECT id, role, content, stopped, partial, model, replaced, parent FROM messages "
                           "WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
        good = {row: Saved(role, content, bool(stopped), bool(partial), _text(who), row, dirty=False)
                for row, role, content, stopped, partial, who, _, _ in found
                if role in ("user", "assistant", "system") and isinstance(content, str)}
        self.skipped = len(found) - len(good)
        parents, leaf = tree([(row, parent, role == "user", bool(replaced))
                              for row, role, _, _, _, _, replaced, parent in found], leaf, good)
        for row, m in good.items():
            m.parent = good.get(parents[row])
        self._release(self.chat)
        self.chat = Chat(list(good.values()), good.get(leaf), _text(system), cid, _settings(_text(settings)),
                          _text(model), _text(where), _text(spec), lock=lock)
        return self.messages()

    def messages(self) -> list[Saved]:
        """The open chat's branch shown, first to last (the other versions: `versions`)."""
        return self.chat.branch

    def rescue(self) -> str | None:
        """At quit: write what is pending one last time; what still cannot be is written as
        Markdown to an unsaved-*.md file (store_advice.rescue). One line saying where, or None."""
        if self.pending:
            try:
                self.sync()
            except StoreError:
                chats = [c for c in (*self._older, self.chat) if self._unwritten(c)]
                return rescue("\n".join(markdown(self, c) for c in chats), self.folder)
        return None


def _text(value: object) -> str | None:
    """A column that should hold text: the text, else None (a BLOB or number put there by hand)."""
    return value if isinstance(value, str) else None


def _settings(text: str | None) -> dict[str, str]:
    try:
        settings = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in settings.items()} if isinstance(settings, dict) else {}
