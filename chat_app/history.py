"""History: the store's other conversations, its prompt history and its Markdown export
(a mixin of chat_app.store.Store, which owns the connection, the locks and the open chat).

Contract: `chats(matching)` lists the saved conversations, newest first (those whose title or
any message holds `matching`, case aside for ASCII letters, when it is given); `rename` and `delete`
change any conversation no other instance holds (ValueError names the one that does);
`models()` names the models saved chats were written with (for the palette and /model's Tab);
`add_prompt` / `prompts()` keep what was typed, for the input's Up across runs (the newest
PROMPTS_KEPT); `export_markdown` writes the branch shown of the open conversation from memory, each reply under
the model that wrote it, each system prompt where it was set and a message with other
versions marked "(version 2 of 3)", a reply's thinking (chat_app.thinking) as a quoted block
headed "**Thinking**" before its answer (its tags gone), and only ever to a regular
file (`write_regular`: a FIFO, device or folder is a ValueError, never a wait). The Markdown
(`/export`'s and the unsaved-*.md written at quit) holds no control character a terminal acts
on: each is made visible as the screen shows it (chat_app.labels.printable: ESC is "␛"; tab and
newline stay), so `cat` of an export sets no title or clipboard; chat.db keeps the text as it
came (nothing lost), and only what is written out is made visible. Read failures
are StoreErrors, as everywhere in the store; a column holding no text where text belongs (a
BLOB title, say) is read as empty, never a crash.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat_app.branches import tree, versions
from chat_app.labels import printable
from chat_app.thinking import split_thought

if TYPE_CHECKING:
    from collections.abc import Callable

    from chat_app.rows import Chat

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
    """The store's queries beyond the open chat (a mixin: chat_app.store.Store provides these)."""

    model: str  # the model the store saves new chats with
    chat: Chat  # the open conversation
    _read: Callable[..., Any]  # runs work(db) against chat.db, reconnecting once
    _claim: Callable[[int], Any]  # holds a conversation's lock
    new_chat: Callable[[], None]

    def chats(self, matching: str = "", limit: int | None = None, offset: int = 0) -> list[ChatInfo]:
        """The saved conversations with messages, the most recently written first; with
        `matching`, only those whose title or a message (not a system prompt, any version)
        holds it; with `limit`, that many from `offset` on. Each is counted and named by its
        branch shown (chat_app.branches). The rows come in the order of an index
        (conversations_by_time), so a page costs its own rows' work however many chats there
        are; only a filter that few chats match reads the rest (their text, once)."""
        like = "%" + matching.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"

        def work(db):
            found = db.execute(
                "SELECT c.id, c.title, COALESCE(c.updated, c.created), c.model, c.leaf "
                "FROM conversations c WHERE EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id "
                "AND m.role != 'system') "
                "AND (? = '' OR c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages x "
                "WHERE x.conversation = c.id AND x.role != 'system' AND x.content LIKE ? ESCAPE '\\')) "
                "ORDER BY COALESCE(c.updated, c.created) DESC, c.id DESC LIMIT ? OFFSET ?",
                (matching, like, like, -1 if limit is None else limit, offset)).fetchall()
            return [(row, *_shown(db, row[0], row[4])) for row in found]
        return [ChatInfo(cid, _str(title) or _first_line(_str(first)), updated if isinstance(updated, int | float) else 0.0,
                         _str(model) or "?", n, cid == self.chat.id, bool(_str(title)))
                for (cid, title, updated, model, _), n, first in self._read(work)]

    def models(self) -> list[tuple[str, str]]:
        """(name, where) for each model a saved chat was written with, the most recently used
        first: `where` is its hf: name where it came from the Hub, else its path (chats saved
        before chat.db kept paths are left out)."""
        def work(db):
            return db.execute(
                "SELECT model, model_spec, model_path FROM conversations "
                "WHERE COALESCE(model_spec, model_path) IS NOT NULL "
                "GROUP BY COALESCE(model_spec, model_path) ORDER BY MAX(COALESCE(updated, created)) DESC").fetchall()
        return [(_str(model) or "?", _str(spec) or _str(path)) for model, spec, path in self._read(work)
                if _str(spec) or _str(path)]

    def rename(self, cid: int, title: str) -> None:
        """Give a conversation a title ("" goes back to its first message)."""
        self._change(cid, "UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or None, cid))

    def delete(self, cid: int) -> None:
        """Delete a conversation; the open one is replaced by a new, empty chat.
        ValueError when another instance holds it."""
        if cid == self.chat.id:
            self.chat.messages, self.chat.deleted = [], []
            self.new_chat()
        self._change(cid, "DELETE FROM messages WHERE conversation = ?", (cid,),
                     "DELETE FROM conversations WHERE id = ?")

    def _change(self, cid: int, sql: str, args: tuple, *more: str) -> None:
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

    def add_prompt(self, text: str) -> None:
        """Keep a prompt for the input's history (a failure is a StoreError, nothing else)."""
        def work(db):
            db.execute("INSERT INTO prompts (text) VALUES (?)", (text,))
            db.execute("DELETE FROM prompts WHERE id <= (SELECT MAX(id) FROM prompts) - ?", (PROMPTS_KEPT,))
        self._read(work)

    def prompts(self) -> list[str]:
        """The prompts of earlier runs, oldest first."""
        rows = self._read(lambda db: db.execute("SELECT text FROM prompts ORDER BY id DESC LIMIT ?",
                                                (PROMPTS_KEPT,)).fetchall())
        return [text for (text,) in reversed(rows) if isinstance(text, str)]

    def export_markdown(self, path: str | Path, overwrite: bool = False) -> int:
        """Write the open conversation (from memory, so it works while chat.db is broken) as
        Markdown to a regular file (write_regular); returns how many messages were written."""
        text, n = self.as_markdown()
        write_regular(path, text, overwrite)
        return n

    def as_markdown(self) -> tuple[str, int]:
        """The open conversation as Markdown, and how many messages it holds (for a worker
        thread to write: the store itself stays on the UI thread)."""
        return markdown(self, self.chat), sum(m.role != "system" for m in self.chat.branch)


def markdown(store: History, chat: Chat) -> str:
    """A conversation's branch shown as Markdown, each reply under the model that wrote it,
    each system prompt where it was set, and a message with other versions marked with
    which it is ("version 2 of 3": the others stay in the chat, not here). Control characters
    are made visible (printable): the file is for a terminal's `cat` too."""
    parts = [f"# Chat with {store.model}\n"]
    if chat.system:
        parts.append(f"**System:** {chat.system}\n")
    for m in chat.branch:
        if m.role == "system":
            parts.append(f"**System:** {m.content}\n" if m.content else "*(system prompt cleared)*\n")
            continue
        who = "You" if m.role == "user" else m.model or chat.model or store.model
        note = "\n\n*(stopped)*" if m.stopped else "\n\n*(unfinished)*" if m.partial else ""
        shown = versions(m, chat.messages)
        note += f"\n\n*(version {shown.index(m) + 1} of {len(shown)})*" if len(shown) > 1 else ""
        text = m.content.strip() if m.role == "user" else with_thinking(m.content)
        parts.append(f"## {who}\n\n{text}{note}\n")
    return printable("\n".join(parts))


def with_thinking(reply: str) -> str:
    """A reply as Markdown, its thinking (if any) a block quote headed **Thinking** above the
    answer: the reader tells it apart, and no renderer drops it as an unknown <think> tag."""
    thought = split_thought(reply)
    if thought.text is None:
        return reply.strip()
    quoted = "\n".join(f"> {line}" if line.strip() else ">" for line in thought.text.split("\n"))
    head = "> **Thinking**" if thought.closed else "> **Thinking** (cut short)"
    return f"{head}\n>\n{quoted}\n\n{thought.answer.strip()}".rstrip()


def _shown(db, cid: int, leaf: object) -> tuple[int, object]:
    """(how many messages, not system prompts, the chat's branch shown holds; its first user
    message's text) from chat.db's rows of it (chat_app.branches.tree)."""
    rows = db.execute("SELECT id, parent, role, replaced, typeof(content) = 'text' FROM messages "
                      "WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
    roles = {row: role for row, _, role, _, text in rows if text and role in ("user", "assistant", "system")}
    parents, at = tree([(row, parent, role == "user", bool(replaced)) for row, parent, role, replaced, _ in rows],
                       leaf, roles)
    branch = []
    while at is not None:
        branch.append(at)
        at = parents[at]
    first = next((row for row in reversed(branch) if roles[row] == "user"), None)
    text = db.execute("SELECT content FROM messages WHERE id = ?", (first,)).fetchone() if first else None
    return sum(roles[row] != "system" for row in branch), text[0] if text else ""


def write_regular(path: str | Path, text: str, overwrite: bool = False) -> None:
    """Write text to a regular file, never anything else: a FIFO, a device or a folder is a
    ValueError, found before opening (os.stat) and again on what was opened (os.fstat), which
    is opened non-blocking (a FIFO with no reader fails at once instead of waiting for one).
    An existing file is FileExistsError unless `overwrite`. A symlink to a regular file is
    followed."""
    path = Path(path).expanduser()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file ({_kind(st.st_mode)}); export to a file")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO made after the stat, with no reader
            raise ValueError(f"{path} is not a regular file (a FIFO); export to a file") from None
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # it changed between the stat and the open
            raise ValueError(f"{path} is not a regular file ({_kind(mode)}); export to a file")
        f.write(text)


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file")


def _str(value: object) -> str:
    """A column that should hold text (a BLOB or number put there by hand is no text)."""
    return value if isinstance(value, str) else ""


def _first_line(text: str, width: int = 60) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= width else line[:width - 1] + "…"
