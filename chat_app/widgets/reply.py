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
Thinking, folded: a reply's reasoning (chat_app.thinking: a `<think>` block, Qwen 3 with thinking
on; or the text before `</think>`, DeepSeek-R1) is one line above the answer,
"▸ thought for 312 words (F3)", "▸ thinking… 40 words (F3)" while it streams; `toggle_thought()`
(F3: `toggle_thinking`, or a click on the line) opens it, dim and italic, in full (live while it
streams) and closes it again. It starts folded. Words, not tokens: chat_app.thinking says why.
`thought` is the reasoning, `text` the answer's source (what Ctrl+T copies), `raw` everything
written, tags included (what the store keeps). A reply whose reasoning only shows as such once
`</think>` comes (DeepSeek-R1's) streams as answer until then, and its Markdown is then
rewritten to the answer alone.
Textual's Markdown is imported with the first reply, not with the app (a tenth of a second
less before the first frame).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from textual import events
from textual.containers import Vertical
from textual.widgets import Static

from chat_app.labels import plain, printable
from chat_app.thinking import Thought, count_words, split_thought, words

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

NOTES = {"stopped": "■ stopped", "context_full": "■ context full", "max_tokens": "■ max_tokens reached",
         "repeating": "■ repeating",
         "error": "■ error", "partial": "■ interrupted (saved as far as it got)"}
KEY = "F3"  # the app's binding that opens and closes the last reply's thinking


class FoldLine(Static):
    """The folded thinking's one line: a click opens or closes it."""

    def on_click(self, event: events.Click) -> None:
        event.stop()
        reply = self.parent
        if isinstance(reply, Reply):
            reply.toggle_thought()


class Reply(Vertical):
    DEFAULT_CSS = """
    Reply .fold { display: none; color: $text-muted; margin: 0 0 1 0; }
    Reply.-thinking .fold { display: block; }
    Reply.-thought .fold { margin: 0; }
    """  # .thought (the reasoning, shown while the reply has -thought: open) is chat.tcss's

    def __init__(self, title: str, text: str = "", note: str = "") -> None:
        super().__init__()
        self.border_title = plain(title)
        self.saved: Any = None  # the store's row it shows (chat_app.store.Saved)
        self.raw, self._note = printable(text), note
        self._split: Thought = split_thought(self.raw)
        self._initial = self._split.answer
        self._sent = len(self._initial)  # of the answer, in the Markdown
        self._stream: MarkdownStream | None = None
        self._done = bool(text)  # a reply shown from the store has ended; a new one streams
        self.opened = False  # the reasoning shown in full

    def compose(self):
        from chat_app.widgets.streamed_markdown import StreamedMarkdown

        yield FoldLine(self._fold_line(), classes="fold", markup=False)
        yield Static("", classes="thought", markup=False)
        yield StreamedMarkdown(self._initial)
        yield Static(NOTES.get(self._note, ""), classes="note", markup=False)

    def on_mount(self) -> None:
        self.set_class(bool(self._note), "-noted")
        self._show_thought()

    @property
    def thought(self) -> str:
        """The reasoning ("" for a reply without)."""
        return self._split.text or ""

    @property
    def has_thought(self) -> bool:
        return self._split.text is not None

    @property
    def fold_line(self) -> str:
        """What the folded line says ("" where there is no reasoning)."""
        return self._fold_line() if self.has_thought else ""

    @property
    def text(self) -> str:
        """Everything written so far (as shown)."""
        shown = self.query("Markdown")
        return shown.first().source if shown else self._initial

    def toggle_thought(self) -> None:
        """Open the reasoning in full, or fold it again (F3, a click on its line)."""
        if self.has_thought:
            self.opened = not self.opened
            self._show_thought()

    def _fold_line(self) -> str:
        mark, n = "▾" if self.opened else "▸", words(count_words(self.thought))
        if not self._split.closed and not self._done:
            return f"{mark} thinking… {n} ({KEY})"
        cut = "" if self._split.closed else ", cut short"
        return f"{mark} thought for {n}{cut} ({KEY})"

    def _show_thought(self) -> None:
        """The line and (open) the reasoning as they stand now."""
        self.set_class(self.has_thought, "-thinking")
        self.set_class(self.has_thought and self.opened, "-thought")
        if not self.is_mounted:
            return
        self.query_one(".fold", Static).update(self.fold_line)
        if self.opened:  # a folded one is not rendered: a long thought costs nothing per batch
            self.query_one(".thought", Static).update(self.thought)

    async def write(self, text: str) -> None:
        if not self.is_attached:  # quitting, or removed: nothing to show it in
            return
        self.raw += printable(text)
        before, self._split = self._split, split_thought(self.raw)
        if (self._split.text, self._split.closed) != (before.text, before.closed):  # the answer alone: no change
            self._show_thought()
        answer = self._split.answer
        if self._split.closed and not before.closed and before.text is None and self._sent:
            await self._rewrite(answer)  # streamed as answer until </think> came (DeepSeek-R1)
            return
        new, self._sent = answer[self._sent:], max(self._sent, len(answer))
        if not new:
            return
        if self._stream is None:
            from textual.widgets import Markdown

            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(new)

    async def _rewrite(self, answer: str) -> None:
        from textual.widgets import Markdown

        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._sent = len(answer)
        await self.query_one(Markdown).update(answer)

    def resume(self) -> None:
        """The reply goes on (/continue): its note goes until it finishes again."""
        self._done = False
        self.remove_class("-noted")
        self.query_one(".note", Static).update("")
        self._show_thought()

    async def finish(self, reason: str) -> None:
        if self._stream is not None:
            await self._stream.stop()  # its flush mounts nothing once detached
            self._stream = None
        self._done = True
        self._show_thought()
        if reason in NOTES:
            self.query_one(".note", Static).update(NOTES[reason])
            self.add_class("-noted")


def thinking_target(replies: Iterable[Reply], picked: object = None) -> Reply | None:
    """The reply F3 acts on: the one picked in the conversation where it has reasoning, else the
    last reply that has (None: no reply has)."""
    if isinstance(picked, Reply) and picked.has_thought:
        return picked
    return next((r for r in reversed(list(replies)) if r.has_thought), None)
