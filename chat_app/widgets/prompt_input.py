"""PromptInput: where the user types (a TextArea that sends on Enter).

Keys: Enter sends (posts `PromptInput.Submitted`); Shift+Enter and Ctrl+J insert a newline
(tmux does not pass Shift+Enter on, Ctrl+J always arrives); Up on the first line recalls
earlier prompts, Down on the last line walks forward again and finally restores the draft.
The input does not clear itself: the app calls `accept()` when it takes the text, so a
refused message stays where it was typed.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline")


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, tab_behavior="focus", show_line_numbers=False, **kwargs)
        self.prompts: list[str] = []
        self._recalled: int | None = None  # index into history while browsing it
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text.strip()))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def accept(self) -> None:
        """The app took the text: remember it and clear the input."""
        text = self.text.strip()
        if text and (not self.prompts or self.prompts[-1] != text):
            self.prompts.append(text)
        self._recalled, self._draft = None, ""
        self.clear()

    # ---- history --------------------------------------------------------------------

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self._recall(-1):
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == self.document.line_count - 1 and self._recall(+1):
            return
        super().action_cursor_down(select)

    def _recall(self, step: int) -> bool:
        """Show the previous (step -1) or next (+1) prompt; False when there is none."""
        if self._recalled is None:
            if step > 0 or not self.prompts:
                return False
            self._draft, self._recalled = self.text, len(self.prompts)
        at = self._recalled + step
        if at < 0:
            return True  # already at the oldest
        if at >= len(self.prompts):
            self._recalled, text = None, self._draft
        else:
            self._recalled, text = at, self.prompts[at]
        self.load_text(text)
        self.move_cursor(self.document.end)
        return True
