"""History: the store's other conversations, its prompt history and its Markdown export
(a mixin of chat_app.store.Store, which owns the connection, the locks and the open chat).

Contract: `chats()` lists the saved conversations, newest first; `rename` and `delete`
change any conversation no other instance holds (ValueError names the one that does);
`add_prompt` / `prompts()` keep what was typed, for the input's Up across runs (the newest
PROMPTS_KEPT); `export_markdown` writes the open conversation from memory, each reply under
the model that wrote it and each system prompt where it was set. Read failures are
StoreErrors, as everywhere in the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chat_app.store import Store

PROMPTS_KEPT = 1000


@dataclass
class ChatInfo:
    """One saved conversation, as the chat list shows it."""
    id: int
    title: str  # the user's title, else the first message's first line
    updated: float  # time of its last write
    model: str
    n_messages: int
    here: bool  # the conversation open in this instance
    named: bool = False  # the title was given by the user


class History:
    def chats(self: Store) -> list[ChatInfo]:
        """Every saved conversation with messages, the most recently written first."""
        def work(db):
            return db.execute(
                "SELECT c.id, c.title, COALESCE(c.updated, c.created), c.model, COUNT(m.id), "
                "(SELECT content FROM messages WHERE conversation = c.id AND role = 'user' ORDER BY id LIMIT 1) "
                "FROM conversations c JOIN messages m ON m.conversation = c.id "
                "WHERE m.role != 'system' GROUP BY c.id ORDER BY MAX(m.id) DESC").fetchall()
        return [ChatInfo(cid, title or _first_line(first or ""), updated, model, n, cid == self.chat.id, bool(title))
                for cid, title, updated, model, n, first in self._read(work)]

    def rename(self: Store, cid: int, title: str) -> None:
        """Give a conversation a title ("" goes back to its first message)."""
        self._change(cid, "UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or None, cid))

    def delete(self: Store, cid: int) -> None:
        """Delete a conversation; the open one is replaced by a new, empty chat.
        ValueError when another instance holds it."""
        if cid == self.chat.id:
            self.chat.messages, self.chat.deleted = [], []
            self.new_chat()
        self._change(cid, "DELETE FROM messages WHERE conversation = ?", (cid,),
                     "DELETE FROM conversations WHERE id = ?")

    def _change(self: Store, cid: int, sql: str, args: tuple, *more: str) -> None:
        def work(db):
            lock = None if cid == self.chat.id else self._claim(cid)  # this instance holds its own
            if lock is None and cid != self.chat.id:
                raise ValueError("that chat is open in another tinyllm-chat")
            try:
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    db.execute(sql, args)
                    for extra in more:
                        db.execute(extra, (cid,))
            finally:
                if lock is not None:
                    lock.close()
        self._read(work)

    def add_prompt(self: Store, text: str) -> None:
        """Keep a prompt for the input's history (a failure is a StoreError, nothing else)."""
        def work(db):
            db.execute("INSERT INTO prompts (text) VALUES (?)", (text,))
            db.execute("DELETE FROM prompts WHERE id <= (SELECT MAX(id) FROM prompts) - ?", (PROMPTS_KEPT,))
        self._read(work)

    def prompts(self: Store) -> list[str]:
        """The prompts of earlier runs, oldest first."""
        rows = self._read(lambda db: db.execute("SELECT text FROM prompts ORDER BY id DESC LIMIT ?",
                                                (PROMPTS_KEPT,)).fetchall())
        return [text for (text,) in reversed(rows)]

    def export_markdown(self: Store, path: str | Path, overwrite: bool = False) -> int:
        """Write the conversation (from memory, so it works while chat.db is broken) as
        Markdown, each reply under the model that wrote it and each system prompt where it
        was set; returns how many messages were written. An existing file is refused
        (FileExistsError) unless `overwrite`."""
        saved = [m for m in self.chat.messages if m.role != "system"]
        parts = [f"# Chat with {self.model}\n"]
        if self.chat.system:
            parts.append(f"**System:** {self.chat.system}\n")
        for m in self.chat.messages:
            if m.role == "system":
                parts.append(f"**System:** {m.content}\n" if m.content else "*(system prompt cleared)*\n")
                continue
            who = "You" if m.role == "user" else m.model or self.chat_model
            note = "\n\n*(stopped)*" if m.stopped else "\n\n*(unfinished)*" if m.partial else ""
            parts.append(f"## {who}\n\n{m.content.strip()}{note}\n")
        with open(Path(path).expanduser(), "w" if overwrite else "x", encoding="utf-8") as f:
            f.write("\n".join(parts))
        return len(saved)


def _first_line(text: str, width: int = 60) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= width else line[:width - 1] + "…"
