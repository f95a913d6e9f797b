"""Reply: one assistant message, Markdown that streams in, then a note if it was cut short.

Contract: `write(text)` appends a fragment through Textual's MarkdownStream (which merges
fragments when rendering falls behind; the app calls it once per drained batch, never per
token); `resume()` lets a finished reply grow again (/continue); `finish(reason)` flushes
the stream and marks a reply that did not end on its own
("stopped", "context full", "error"; "partial": one a crash cut short, shown on resume).
Nothing written is ever dropped while the reply is shown: `text` is the full source. Once
it is not (the app has begun to quit, or the reply was removed), writes are dropped, and
so is what the stream still held: there is nothing left to show them in (the app saves its own
copy of the text; chat_app.widgets.streamed_markdown). Control characters from a
model (noise, or an escape sequence) are shown as visible symbols, never sent to the terminal;
the title (the model's name) is plain text, never markup (chat_app.labels).
Textual's Markdown is imported with the first reply, not with the app (a tenth of a second
less before the first frame).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import Vertical
from textual.widgets import Static

from chat_app.labels import plain, printable

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

NOTES = {"stopped": "■ stopped", "context_full": "■ context full", "max_tokens": "■ max_tokens reached",
         "error": "■ error", "partial": "■ interrupted (saved as far as it got)"}

class Reply(Vertical):
    def __init__(self, title: str, text: str = "", note: str = "") -> None:
        super().__init__()
        self.border_title = plain(title)
        self._initial, self._note = printable(text), note
        self._stream: MarkdownStream | None = None

    def compose(self):
        from chat_app.widgets.streamed_markdown import StreamedMarkdown

        yield StreamedMarkdown(self._initial)
        yield Static(NOTES.get(self._note, ""), classes="note", markup=False)

    def on_mount(self) -> None:
        self.set_class(bool(self._note), "-noted")

    @property
    def text(self) -> str:
        """Everything written so far (as shown)."""
        shown = self.query("Markdown")
        return shown.first().source if shown else self._initial

    async def write(self, text: str) -> None:
        if not self.is_attached:  # quitting, or removed: nothing to show it in
            return
        if self._stream is None:
            from textual.widgets import Markdown

            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(printable(text))

    def resume(self) -> None:
        """The reply goes on (/continue): its note goes until it finishes again."""
        self.remove_class("-noted")
        self.query_one(".note", Static).update("")

    async def finish(self, reason: str) -> None:
        if self._stream is not None:
            await self._stream.stop()  # its flush mounts nothing once detached
            self._stream = None
        if reason in NOTES:
            self.query_one(".note", Static).update(NOTES[reason])
            self.add_class("-noted")
