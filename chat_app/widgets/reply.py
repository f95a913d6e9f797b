"""Reply: one assistant message, Markdown that streams in, then a note if it was cut short.

Contract: `write(text)` appends a fragment through Textual's MarkdownStream (which merges
fragments when rendering falls behind; the app calls it once per drained batch, never per
token); `resume()` lets a finished reply grow again (/continue); `finish(reason)` flushes
the stream and marks a reply that did not end on its own
("stopped", "context full", "repeating", "error"; "partial": one a crash cut short, shown on resume).
Nothing written is ever dropped while the reply is shown: `text` is the full source. Once
it is not (the app has begun to quit, or the reply was removed), writes are dropped, and
so is what the stream still held: there is nothing left to show them in (the app saves its own
copy of the text; chat_app.widgets.streamed_markdown). Control characters from a
model (noise, or an escape sequence) are shown as visible symbols, never sent to the terminal;
the title (the model's name) is plain text, never markup (chat_app.labels).
A reply that opens with a `<think>` block (Qwen 3 with thinking on) shows its reasoning apart,
above the answer, dim and italic (`thought`, as it streams; the block's tags are not shown);
the answer after `</think>` is the Markdown. `text` is the answer's source (what Ctrl+T copies),
`raw` everything written, tags included (what the store keeps).
Textual's Markdown is imported with the first reply, not with the app (a tenth of a second
less before the first frame).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.containers import Vertical
from textual.widgets import Static

from chat_app.labels import plain, printable

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

OPEN, CLOSE = "<think>", "</think>"
NOTES = {"stopped": "■ stopped", "context_full": "■ context full", "max_tokens": "■ max_tokens reached",
         "repeating": "■ repeating",
         "error": "■ error", "partial": "■ interrupted (saved as far as it got)"}


def split_thought(text: str) -> tuple[str | None, str]:
    """(the reasoning of a reply that opens with a <think> block, or None; the answer after
    it). A block still open has all the text; the start of an opening tag ("<thi") is neither
    yet."""
    head = text.lstrip()
    if head.startswith(OPEN):
        body = head[len(OPEN):]
        thought, closed, answer = body.partition(CLOSE)
        return thought.strip("\n"), answer.lstrip("\n") if closed else ""
    if head and OPEN.startswith(head):
        return "", ""
    return None, text


class Reply(Vertical):
    def __init__(self, title: str, text: str = "", note: str = "") -> None:
        super().__init__()
        self.border_title = plain(title)
        self.saved: Any = None  # the store's row it shows (chat_app.store.Saved)
        self.raw, self._note = printable(text), note
        self._thought, self._initial = split_thought(self.raw)
        self._sent = len(self._initial)  # of the answer, in the Markdown
        self._stream: MarkdownStream | None = None

    def compose(self):
        from chat_app.widgets.streamed_markdown import StreamedMarkdown

        yield Static(self._thought or "", classes="thought", markup=False)
        yield StreamedMarkdown(self._initial)
        yield Static(NOTES.get(self._note, ""), classes="note", markup=False)

    def on_mount(self) -> None:
        self.set_class(bool(self._note), "-noted")
        self.set_class(bool(self._thought), "-thought")

    @property
    def thought(self) -> str:
        """The reasoning shown apart ("" for a reply without)."""
        return self._thought or ""

    @property
    def text(self) -> str:
        """Everything written so far (as shown)."""
        shown = self.query("Markdown")
        return shown.first().source if shown else self._initial

    async def write(self, text: str) -> None:
        if not self.is_attached:  # quitting, or removed: nothing to show it in
            return
        self.raw += printable(text)
        thought, answer = split_thought(self.raw)
        if thought != self._thought:
            self._thought = thought
            self.query_one(".thought", Static).update(thought or "")
            self.set_class(bool(thought), "-thought")
        new, self._sent = answer[self._sent:], max(self._sent, len(answer))
        if not new:
            return
        if self._stream is None:
            from textual.widgets import Markdown

            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(new)

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
