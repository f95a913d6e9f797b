"""Store: conversations saved as they happen, in SQLite.

Where: `$TINYLLM_CHAT_DATA_DIR` if set (tests point it at a tmp dir), else
`platformdirs.user_data_dir("tinyllm-chat")`; the file is `chat.db`.

Contract: one row per conversation (model name, system prompt, created time) and one per
message (role, content, stopped). A conversation row is written with its first message, so
an empty chat leaves nothing behind; every `add` commits at once, so a crash loses at most
the reply in flight. A regenerated reply replaces the last one (`drop_last_reply`). The store
is used from the UI thread only; it never sees token ids (the session re-encodes on resume).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "TINYLLM_CHAT_DATA_DIR"
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


@dataclass
class Saved:
    role: str  # "user" | "assistant"
    content: str
    stopped: bool = False  # a reply cut short with Esc


def default_data_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tinyllm-chat"))


class Store:
    def __init__(self, path: str | Path, model: str = "model", system: str | None = None):
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.executescript(SCHEMA)
        self.model, self.system = model, system
        self.conversation: int | None = None  # None until the first message is saved

    @classmethod
    def open(cls, data_dir: str | Path | None = None, model: str = "model",
             system: str | None = None) -> Store:
        """Open (creating) chat.db in data_dir; an unusable folder is a ValueError."""
        folder = Path(data_dir) if data_dir else default_data_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return cls(folder / "chat.db", model, system)
        except (OSError, sqlite3.Error) as e:
            raise ValueError(f"cannot open the chat history in {folder} ({e}); "
                             f"set {ENV_DIR} to a writable folder") from None

    def close(self) -> None:
        self.db.close()

    # ---- writing -----------------------------------------------------------------------

    def new_chat(self) -> None:
        self.conversation = None

    def add(self, role: str, content: str, stopped: bool = False) -> None:
        if self.conversation is None:
            cur = self.db.execute("INSERT INTO conversations (created, model, system) VALUES (?, ?, ?)",
                                  (time.time(), self.model, self.system))
            self.conversation = cur.lastrowid
        self.db.execute("INSERT INTO messages (conversation, role, content, stopped) VALUES (?, ?, ?, ?)",
                        (self.conversation, role, content, int(stopped)))

    def drop_last_reply(self) -> None:
        """Forget the last assistant message (it is being regenerated)."""
        self.db.execute("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages "
                        "WHERE conversation = ? AND role = 'assistant')", (self.conversation,))

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        if self.conversation is not None:
            self.db.execute("UPDATE conversations SET system = ? WHERE id = ?",
                            (self.system, self.conversation))

    # ---- reading -----------------------------------------------------------------------

    def messages(self) -> list[Saved]:
        rows = self.db.execute("SELECT role, content, stopped FROM messages "
                               "WHERE conversation = ? ORDER BY id", (self.conversation,))
        return [Saved(role, content, bool(stopped)) for role, content, stopped in rows]

    def resume_last(self) -> list[Saved]:
        """Continue the most recent conversation that has messages; [] if there is none."""
        row = self.db.execute("SELECT c.id, c.system FROM conversations c JOIN messages m "
                              "ON m.conversation = c.id ORDER BY m.id DESC LIMIT 1").fetchone()
        if row is None:
            return []
        self.conversation, self.system = row
        return self.messages()

    def export_markdown(self, path: str | Path, extra: Saved | None = None) -> int:
        """Write the conversation (plus `extra`, a reply still streaming) as Markdown;
        returns how many messages were written."""
        saved = self.messages() + ([extra] if extra else [])
        parts = [f"# Chat with {self.model}\n"]
        if self.system:
            parts.append(f"**System:** {self.system}\n")
        for m in saved:
            who = "You" if m.role == "user" else self.model
            note = "\n\n*(stopped)*" if m.stopped else ""
            parts.append(f"## {who}\n\n{m.content.strip()}{note}\n")
        Path(path).expanduser().write_text("\n".join(parts), encoding="utf-8")
        return len(saved)
