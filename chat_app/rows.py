"""The rows of a chat as the store holds them in memory: `Saved` (one message), `Chat` (one
conversation: its messages, every branch's, and the leaf of the one shown), and
`StoreError`, what a failed read or write raises; `path(leaf)`, the branch a leaf ends (the
rest of the tree's functions: chat_app.branches). The store (chat_app.store) owns them; the
branches, the history and everything that shows a chat read them. Imports nothing of the app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO


def path(leaf: Saved | None) -> list[Saved]:
    """The branch that ends at `leaf`, its first message first."""
    branch: list[Saved] = []
    while leaf is not None:
        branch.append(leaf)
        leaf = leaf.parent
    return branch[::-1]


class StoreError(Exception):
    """A read or write of chat.db failed; the message says where it is and what to do."""


@dataclass(eq=False)
class Saved:
    role: str  # "user" | "assistant" | "system" (a system prompt set mid-chat; "" clears it)
    content: str
    stopped: bool = False  # a reply cut short with Esc
    partial: bool = False  # a reply still streaming (or cut by a crash)
    model: str | None = None  # a reply: the model that wrote it
    id: int | None = field(default=None, repr=False)  # its row, once written
    dirty: bool = field(default=True, repr=False)  # changed since the last write
    parent: Saved | None = field(default=None, repr=False)  # the message before it on its branch (set by `add`)


@dataclass(eq=False)
class Chat:
    messages: list[Saved] = field(default_factory=list)  # every branch's, in the order written
    leaf: Saved | None = None  # the last message of the branch shown
    system: str | None = None  # the system prompt it started with
    id: int | None = None
    settings: dict[str, str] = field(default_factory=dict)  # /set NAME VALUE, in the order given
    model: str | None = None  # the model it was started with (a saved chat's)
    model_path: str | None = None  # ... its local path (None: a chat.db from before it was kept)
    model_spec: str | None = None  # ... the hf: spec it came by, where it came from the Hub
    deleted: list[int] = field(default_factory=list)  # rows to delete at the next write
    meta_dirty: bool = False  # system (before the first message), settings or leaf changed
    lock: IO | None = None

    @property
    def branch(self) -> list[Saved]:
        """The messages shown, first to last."""
        return path(self.leaf)

    @property
    def current_system(self) -> str | None:
        for m in reversed(self.branch):
            if m.role == "system":
                return m.content or None
        return self.system
