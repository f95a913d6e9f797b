"""Conversation: the scrolling list of messages (user prompts and streamed replies).

Contract: everything shown stays shown (when the session drops old turns from the model's
context, they stay here); `clear()` is the only way messages leave, plus `drop_last_reply()`
for a regenerated reply. The view follows new text (anchored to the bottom) until the user
scrolls up. An empty conversation shows a one-line hint.
"""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from chat_app.widgets.reply import Reply, printable

HINT = "Type a message and press Enter. Ctrl+J adds a line; F1 lists every key and command."


class UserMessage(Static):
    """A user prompt, shown as typed (no Markdown)."""

    def __init__(self, text: str) -> None:
        super().__init__(printable(text), markup=False)
        self.text = text
        self.border_title = "you"


class Conversation(VerticalScroll, can_focus=False):
    def compose(self):
        yield Static(HINT, id="hint", markup=False)

    def on_mount(self) -> None:
        self.anchor()

    async def add_user(self, text: str) -> UserMessage:
        await self._drop_hint()
        widget = UserMessage(text)
        await self.mount(widget)
        return widget

    async def add_reply(self, title: str, text: str = "", note: str = "") -> Reply:
        await self._drop_hint()
        widget = Reply(title, text, note)
        await self.mount(widget)
        self.anchor()
        return widget

    async def add_note(self, text: str) -> Static:
        """A line between messages (a system prompt set mid-chat)."""
        await self._drop_hint()
        widget = Static(text, classes="chat-note", markup=False)
        await self.mount(widget)
        return widget

    async def drop_last_reply(self) -> None:
        replies = self.query(Reply)
        if replies:
            await replies.last().remove()

    async def clear(self) -> None:
        await self.remove_children()
        await self.mount(Static(HINT, id="hint", markup=False))

    async def _drop_hint(self) -> None:
        for hint in self.query("#hint"):
            await hint.remove()
