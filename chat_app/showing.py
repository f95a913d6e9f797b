"""Showing a saved chat's messages, and the versions label each one carries.

Contract: `show_messages(core, saved)` shows messages of the open chat's branch below what is
shown (each widget holding its row; a message with other versions says which it is on its
border: `label`, "‹ 2/3 ›"); a branch that ends on a user message (its reply never began: a
crash) gets an empty reply first, saved, so turns alternate. `load_session(core, branch)`
queues the job that makes the session's conversation that branch (in order with the other
jobs). Used by the chat switcher, the versions and the editor (chat_app.chats, versions,
editing). Imports neither Textual nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chat_app.jobs import LoadMessages
from chat_app.store import Saved

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from chat_app.store import Store


def label(store: Store, message: Saved) -> str:
    """Its border's "‹ 2/3 ›" ("" for a message with no other version)."""
    shown = store.versions(message)
    return f"‹ {shown.index(message) + 1}/{len(shown)} ›" if len(shown) > 1 else ""


def mark(widget: Any, store: Store, message: Saved) -> None:
    widget.border_subtitle = label(store, message)


def system_note(text: str) -> str:
    return f"system prompt: {text}" if text else "system prompt cleared"


async def show_messages(core: ChatCore, saved: list[Saved]) -> None:
    store, conversation = core.store, core.view.conversation
    said = [m for m in store.messages() if m.role != "system"]
    if said and said[-1].role == "user":
        store_reply = Saved("assistant", "", stopped=True, model=core.model_name)
        core.save(store.add, store_reply)
        saved = [*saved, store_reply]
    for m in saved:
        if m.role == "user":
            widget: Any = await conversation.add_user(m.content, saved=m)
        elif m.role == "system":
            widget = await conversation.add_note(system_note(m.content), saved=m)
        else:
            note = "partial" if m.partial else "stopped" if m.stopped else ""
            widget = await conversation.add_reply(m.model or store.chat_model, m.content, note, saved=m)
        if m.role != "system":
            mark(widget, store, m)


def load_session(core: ChatCore, branch: list[Saved]) -> None:
    """The session's conversation becomes `branch` (a job, in order with the others)."""
    pairs = [("system", core.store.system or "")]
    core.queue(LoadMessages(pairs + [(m.role, m.content) for m in branch if m.role != "system"]))
