"""Conversation: the scrolling list of messages (user prompts and streamed replies).

Contract: everything shown stays shown (when the session drops old turns from the model's
context, they stay here); `clear()` is the only way messages leave, plus `drop_last_reply()`
for a regenerated reply and `drop_last_turn()` for an edited message and its reply. The view
follows new text (anchored to the bottom) until the user scrolls up; a command's note
(`add_system_note`, chat_app.widgets.system_note) brings it back to the bottom, where the
note is. An empty conversation shows a one-line hint.

Reading and copying: the conversation takes focus (Tab from the input). Focused, Up/Down
pick a message, a command's note or one code block of a reply (marked, and scrolled into
view), Home/End the first/last, PgUp/PgDn scroll; `c` or Enter copies what is picked (`copy_to_clipboard`,
OSC 52: works over SSH and in tmux). `picked_text()` is what would be copied (None: nothing).
Left/Right on a picked message post `Conversation.Versions(message, step)`: the app shows its
version before or after (chat_app.versions). A message shown for a saved one holds it
(`saved`, set by whoever adds it); `remove_from(widget)` takes it and all below it away.
A user message's attached files (the fenced blocks chat_app.attachments.compose put before its
text) show as one line each, "▪ NAME · attached, ~N tokens", not their text (a 1 MB file drawn
in full made every frame slow); copying the message copies it all, as sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from chat_app.attachments import split
from chat_app.labels import plain, printable
from chat_app.widgets.reply import Reply
from chat_app.widgets.system_note import SystemNote

HINT = "Type a message and press Enter. Ctrl+J adds a line; F1 lists every key and command."


class UserMessage(Static):
    """A user prompt, shown as typed (no Markdown). `mark(note)` says under it what became of
    it ("waiting for the model to load"); `mark("")` takes the note away."""

    def __init__(self, text: str) -> None:
        attached, typed = split(text)
        files = "\n".join(f"▪ {a.name} · attached, ~{a.tokens:,} token{'s' * (a.tokens != 1)}" for a in attached)
        super().__init__(printable("\n\n".join(part for part in (files, typed) if part)), markup=False)
        self.text = text
        self.border_title = "you"
        self.saved: Any = None  # the store's row it shows (chat_app.store.Saved)

    def mark(self, note: str) -> None:
        self.border_subtitle = note
        self.set_class(bool(note), "-marked")


class Conversation(VerticalScroll, can_focus=True):
    BINDINGS = [Binding("up,k", "pick(-1)", "Previous", show=False), Binding("down,j", "pick(1)", "Next", show=False),
                Binding("home", "pick_end(0)", show=False), Binding("end", "pick_end(-1)", show=False),
                Binding("c,enter", "copy_picked", "Copy", show=False),
                Binding("left,h", "versions(-1)", show=False), Binding("right,l", "versions(1)", show=False)]

    @dataclass
    class Versions(Message):
        widget: Widget  # the message picked (a UserMessage or a Reply)
        step: int  # -1: its version before; 1: the one after

    def __init__(self) -> None:
        super().__init__()
        self.picked: Widget | None = None

    def compose(self):
        yield Static(HINT, id="hint", markup=False)

    def on_mount(self) -> None:
        self.anchor()

    async def add_user(self, text: str, saved: Any = None) -> UserMessage:
        await self._drop_hint()
        widget = UserMessage(text)
        widget.saved = saved
        await self.mount(widget)
        return widget

    async def add_reply(self, title: str, text: str = "", note: str = "", saved: Any = None) -> Reply:
        await self._drop_hint()
        widget = Reply(title, text, note)
        widget.saved = saved
        await self.mount(widget)
        self.anchor()
        return widget

    async def add_note(self, text: str, saved: Any = None) -> Static:
        """A line between messages (a system prompt set mid-chat)."""
        await self._drop_hint()
        widget = Static(plain(text), classes="chat-note")
        widget.saved = saved  # type: ignore[attr-defined]
        await self.mount(widget)
        return widget

    def shown(self, saved: Any) -> Widget | None:
        """The widget that shows a saved message (None: none does)."""
        return next((w for w in self.children if getattr(w, "saved", None) is saved), None)

    async def remove_from(self, widget: Widget) -> None:
        """`widget` and everything below it leave (a branch switched: chat_app.versions)."""
        children = list(self.children)
        if self.picked in children[children.index(widget):]:
            self.picked = None
        await self.remove_children(children[children.index(widget):])

    def add_system_note(self, text: str, severity: str = "information") -> SystemNote:
        """What a command says back, at the bottom, in view (mounted on the next idle: callable
        from sync code; no part of the chat, chat_app.widgets.system_note)."""
        for hint in self.query("#hint"):
            hint.remove()
        widget = SystemNote(text, severity)
        self.mount(widget)
        self.anchor()  # the user just typed a command: show its answer even if they had scrolled up
        self.call_after_refresh(self.scroll_end, animate=False)  # once it has its height
        return widget

    def last_reply(self) -> Reply:
        """The last reply shown (/continue goes on with it)."""
        return self.query(Reply).last()

    async def drop_last_reply(self) -> None:
        replies = self.query(Reply)
        if replies:
            await replies.last().remove()

    async def drop_last_turn(self) -> None:
        """The last user message and the reply after it leave (notes between them stay)."""
        users = self.query(UserMessage)
        if users:
            last = users.last()
            children = list(self.children)
            for widget in children[children.index(last):]:
                if isinstance(widget, UserMessage | Reply):
                    await widget.remove()

    # ---- picking and copying --------------------------------------------------------------

    def items(self) -> list[Widget]:
        """What can be picked, top to bottom: messages, and each code block after its reply."""
        return list(self.query("UserMessage, Reply, SystemNote, MarkdownFence"))

    def _pick(self, item: Widget | None) -> None:
        if self.picked is not None:
            self.picked.remove_class("-picked")
        self.picked = item
        if item is not None:
            item.add_class("-picked")
            self.scroll_to_widget(item, animate=False, top=item.outer_size.height > self.size.height)

    def action_pick(self, step: int) -> None:
        items = self.items()
        if not items:
            return
        at = items.index(self.picked) + step if self.picked in items else len(items) - 1
        self._pick(items[max(0, min(at, len(items) - 1))])

    def action_pick_end(self, end: int) -> None:
        items = self.items()
        if items:
            self._pick(items[end])
        (self.scroll_home if end == 0 else self.scroll_end)(animate=False)

    def action_versions(self, step: int) -> None:
        if isinstance(self.picked, UserMessage | Reply):
            self.post_message(self.Versions(self.picked, step))
        else:
            self.notify("Pick a message (Up/Down) to see its other versions.", markup=False)

    def pick(self, widget: Widget) -> None:
        """Pick `widget` (a message shown again after a switch keeps the pick)."""
        self._pick(widget)

    def on_blur(self) -> None:
        self._pick(None)

    def picked_text(self) -> tuple[str, str] | None:
        """(what it is, its text) of the picked item, or None."""
        from textual.widgets._markdown import MarkdownFence  # imported by the first reply already

        item = self.picked
        if isinstance(item, MarkdownFence):
            return "code block", item.code
        if isinstance(item, UserMessage):
            return "message", item.text
        if isinstance(item, SystemNote):
            return "note", item.text
        if item is not None and item.is_attached:
            return "reply", item.text  # a Reply: its Markdown source
        return None

    def action_copy_picked(self) -> None:
        picked = self.picked_text()
        if picked is None:
            self.notify("Nothing picked: Up/Down pick a message or code block.", markup=False)
            return
        what, text = picked
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied the {what} ({lines(text)}).", markup=False)

    async def clear(self) -> None:
        self.picked = None
        await self.remove_children()
        await self.mount(Static(HINT, id="hint", markup=False))

    async def _drop_hint(self) -> None:
        for hint in self.query("#hint"):
            await hint.remove()


def lines(text: str) -> str:
    n = text.count("\n") + 1 if text else 0
    return f"{n} line" if n == 1 else f"{n} lines"
