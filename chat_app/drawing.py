"""Drawer: draws what the app's worker reports, on the UI thread, and owns the reply in flight.

Contract: `drain()` (a timer, at most DRAIN_HZ times a second) empties the worker's outbox;
the Token texts drained together are ONE Markdown update, and nothing is dropped. Each other
event goes to the part of the app that owns it: Loaded and a model's failure to the model
switcher (chat_app.model_switch), a chat's "open" barrier to the chat switcher
(chat_app.chats), the load's Progress to the load bar. A message sent is saved to the chat
before anything else happens to it (`ask()`, before it is shown or the model is asked: killed
right after Enter, --resume still shows it), shown at once (`send()`; the status bar says
"prefilling" while its prompt is read) and taken back into the input, and out of the chat, if
the session refuses it; its reply replaces what is on screen only once it has begun
(Started); it is saved as partial at its first text and then at least every
SAVE_EVERY_S, and whole (stopped or not) at its Finished. A failed reply keeps what streamed,
marked; a refused message goes back to the input. The status bar follows each reply's numbers
and a step kind that changed between replies (a compile ended). Nothing is drawn while the app
shuts down. `busy` is true from the moment a reply is asked for (`begin()`) until it ends.
"""

from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING, Any

from textual.css.query import NoMatches

from chat_app.chats import system_note
from chat_app.events import Done, Failed, Finished, Loaded, Prefilled, Progress, Started, Token
from chat_app.model_switch import ENDED
from chat_app.store import Saved
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply
from chat_app.worker import streams

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from tinyllm.session.chat_events import StepStats

DRAIN_HZ = 30
PREFILLING = "prefilling"  # the status bar's state from a reply's job until it begins
SAVE_EVERY_S = 1.0  # a streaming reply is written to the store at least this often


def echo(text: str, width: int = 100) -> str:
    """Text a notice repeats back: its first line, at most `width` characters (a notice holding a
    whole long system prompt covered the screen)."""
    line = text.strip().split("\n", 1)[0]
    if line == text.strip() and len(line) <= width:
        return line
    return f"{line[:width - 1].rstrip()}… ({len(text):,} characters)"


class Drawer:
    def __init__(self, app: ChatApp) -> None:
        self.app = app
        self.busy = False  # a send/regenerate/continue is queued or running
        self.stop_wanted = False  # Esc was pressed for the reply in flight
        self.reply: Reply | None = None  # the reply streaming now
        self.row: Saved | None = None  # ... and its row in the store
        self.text: list[str] = []  # ... and its text as the session gave it
        self.saved_at = 0.0
        self.pending: UserMessage | None = None  # a message sent, shown, its reply not begun yet
        self.asked: Saved | None = None  # ... and its row in the store, saved when it was sent
        self.prefill_tokens = 0  # the last reply's prefill
        self.last_stats: StepStats | None = None  # the last reply's numbers (/stats)
        self.compile_failure_said = False

    def begin(self, kind: str, arg: Any) -> None:
        """Queue a job that streams a reply; the status bar says "prefilling" until it begins."""
        self.busy = True
        self.app.status.show(state=PREFILLING)
        self.app.queue_job(kind, arg)

    def ask(self, text: str) -> Saved:
        """Save a message being sent to the open chat, first of all (before the input gives it
        up, before it is shown or the model is asked). Killed 50 ms after Enter, the message was
        only in the prompt history, and --resume showed nothing (issue 52): it was saved when its
        reply began. Its reply's Started finds the row; a refusal takes it back (`Store.drop`)."""
        self.asked = Saved("user", text)
        self.app.save(self.app.store.add, self.asked)
        return self.asked

    def take_back(self) -> None:
        """The message `ask()` saved was not sent after all (the session refused it, or no model
        loaded): out of the chat again, as it goes back into the input."""
        asked, self.asked = self.asked, None
        if asked is not None:
            self.app.save(self.app.store.drop, asked)

    async def send(self, text: str) -> None:
        """Send a message (saved by `ask()` first): shown at once, before its reply begins (a
        prompt of thousands of tokens is read for seconds, which showed nothing before,
        2026-12-06), taken back from the conversation if the session refuses it. Busy, and said
        so on the status bar, before the message is drawn: no frame shows the message under "ready"."""
        self.busy = True
        self.app.status.show(state=PREFILLING)
        self.pending = await self.app.conversation.add_user(text, saved=self.asked)
        self.begin("send", text)

    def stop(self) -> None:
        s = self.app.session
        if s is not None and self.busy:
            self.stop_wanted = True
            s.stop()

    def save_partial(self) -> None:
        """Write the streaming reply's text so far to the store (marked partial)."""
        if self.row is not None:
            self.saved_at = time.monotonic()
            self.app.save(self.app.store.update, self.row, "".join(self.text), partial=True)

    async def drain(self) -> None:
        try:
            await self._drain()
        except NoMatches:  # only shutting down removes the app's widgets: nothing left to show
            return

    async def _drain(self) -> None:
        app = self.app
        pieces: list[str] = []
        live: StepStats | None = None
        while app.is_running:  # not while shutting down: the widgets may be gone
            try:
                item = app.session_worker.outbox.get_nowait()
            except queue.Empty:
                break
            match item:
                case Token(text=text, stats=stats):
                    pieces.append(text)
                    live = stats
                    continue
            await self._write(pieces)
            pieces = []
            await self._handle(item)
            if isinstance(item, Finished):
                live = None
        await self._write(pieces)
        if live is not None:
            self.show_stats(live, "generating")
        s = app.session
        app.models.say_if_ended()
        if s is not None and not self.busy and app.status.fields.get("step") != s.step_kind:
            app.status.show(step=s.step_kind)  # a compile ended between replies: say so now
        if self.row is not None and time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            self.save_partial()

    async def _write(self, pieces: list[str]) -> None:
        if pieces and self.reply is not None:
            text = "".join(pieces)
            await self.reply.write(text)
            self.text.append(text)
            if self.saved_at == 0.0:  # the reply's first text is saved at once
                self.save_partial()

    async def _handle(self, item: Any) -> None:
        app = self.app
        match item:
            case Finished():
                await self._finished(item)
            case Prefilled():
                self._prefilled(item)
            case Loaded(session=s, switched=switched, keep_chat=keep_chat):
                await app.models.loaded(s, switched, keep_chat)
            case Progress(step="tensors", done=done, total=total):
                app.load_progress.advance(done, total)
            case Progress(step=step, done=done, total=total, seconds=seconds, compiling=compiling):
                app.load_progress.kernels(step, done, total, seconds, compiling)
            case Started():
                await self._started(item)
            case Failed(kind="load" | "model" | "restart"):
                app.models.failed(item)
            case Failed():
                await self._failed(item)
            case Done():
                await self._done(item)

    async def _started(self, item: Started) -> None:
        app = self.app
        conversation, store = app.conversation, app.store
        if item.kind == "regenerate":  # the old reply stays, another version (chat_app.versions)
            await conversation.drop_last_reply()
            last = [m for m in store.messages() if m.role != "system"][-1:]
            if last and last[0].role == "assistant":
                app.save(store.branch, last[0])
        elif item.kind == "edit":  # the edit takes the place of the last turn (chat_app.editing)
            await app.editor.turn_replaced(item.text)
        elif item.kind == "continue_reply":  # the last reply goes on: same widget, same row
            self.reply = conversation.query(Reply).last()
            self.reply.resume()
            self.row = [m for m in store.messages() if m.role == "assistant"][-1]
            self.text, self.saved_at = [self.row.content], 0.0
            app.status.show(state="generating")
            return
        else:
            pending, self.pending = self.pending, None  # shown when it was sent (send())
            asked, self.asked = self.asked, None  # saved when it was sent (ask())
            if asked is None or asked.content != item.text or store.messages()[-1:] != [asked]:
                asked = Saved("user", item.text)  # the chat changed since (Ctrl+N while the model loaded)
                app.save(store.add, asked)
            if not (pending is not None and pending.is_attached or await app.models.waiting_began()):
                await conversation.add_user(item.text)  # (a message sent while the model loaded is shown already)
            conversation.query(UserMessage).last().saved = asked
        self.row, self.text, self.saved_at = Saved("assistant", "", partial=True, model=app.model_name), [], 0.0
        app.save(store.add, self.row)
        self.reply = await conversation.add_reply(app.model_name, saved=self.row)
        app.versions.mark(self.reply, self.row)
        app.status.show(state="generating")

    def _prefilled(self, item: Prefilled) -> None:
        self.prefill_tokens = item.n_tokens
        if self.stop_wanted and self.app.session is not None:  # Esc came before the reply began: again
            self.app.session.stop()
        if item.dropped:
            self.app.say(f"Context full: the oldest {item.dropped} messages no longer reach the model "
                         "(they stay on screen and in the saved chat).", "warning")

    def _ended(self) -> None:
        self.reply, self.row, self.busy, self.stop_wanted = None, None, False, False

    async def _finished(self, item: Finished) -> None:
        if self.reply is not None:
            await self.reply.finish(item.reason)
        row = self.row
        self._ended()
        if row is not None:
            self.app.save(self.app.store.update, row, item.text, partial=False, stopped=item.reason == "stopped")
        self.show_stats(item.stats, "ready")
        if item.reason == "repeating":
            self.app.say("The reply was saying the same thing again and again: it was stopped there. Ctrl+F "
                         "continues it; /set repeat_stop off turns this off.", "warning")
        if item.reason == "context_full":
            self.app.say(f"The reply filled the context ({item.stats.max_len} positions); "
                         "the next turn drops the oldest messages.", "warning")

    async def _failed(self, item: Failed) -> None:
        app = self.app
        ended = app.models.ended()  # a reply cut short by it, or a job refused after it: said once, with what comes next
        said = app.note if item.kind == "set_system" else app.say  # /system's refusal is the command's answer
        said(f"{item.message}; the next message starts it again" if ended else item.message, "error")
        if not streams(item.kind):
            return
        if self.reply is not None:  # it failed mid-reply: keep what streamed, marked
            await self.reply.finish("error")
            if self.row is not None:
                app.save(app.store.update, self.row, "".join(self.text), partial=False, stopped=True)
        elif item.kind == "send":
            self.take_back()  # saved when it was sent: out of the chat, back into the input
            pending, self.pending = self.pending, None
            if pending is not None and pending.is_attached:
                await pending.remove()
            await app.models.waiting_refused()
            app.prompt.give_back(item.arg)  # refused before it was shown (or while it waited)
        elif item.kind == "edit":
            app.editor.edit_refused(item.arg)
        self._ended()
        app.status.show(state=ENDED if ended else "ready")

    async def _done(self, item: Done) -> None:
        app = self.app
        s = app.session
        assert s is not None, "jobs run only after the session is loaded"
        if item.kind == "new_chat":
            await app.conversation.clear()
            app.store.new_chat()
            app.status.show(tok_s=None, ttft_ms=None, window=None, position=len(s.context))
        elif item.kind == "set_system":
            system = s.system
            app.save(app.store.set_system, system)
            if s.messages:  # where it was set, as the saved chat shows it again
                await app.conversation.add_note(system_note(system or ""))
            else:  # /system's answer (a command's note: chat_app.commands)
                app.note(f"System prompt set: {echo(system)}" if system else "System prompt cleared.")
        elif item.kind == "load_messages":
            app.status.show(position=len(s.context))
        elif item.kind == "params":  # a chat's settings, its thinking switch among them
            app.status.show(thinking=getattr(s, "thinking", None))
        elif item.kind == "restart":
            app.models.restarted()
            app.say("The model process is running again.")
        elif item.kind == "open":
            await app.chats.open_chat(item.arg)

    def show_stats(self, stats: StepStats, state: str) -> None:
        app = self.app
        app.status.show(state=state, tok_s=stats.tok_per_s, ttft_ms=stats.ttft_ms, window=stats.window,
                        position=stats.position, max_len=stats.max_len, graphs=stats.graphs, step=stats.step)
        self.last_stats = stats
        if stats.step == "compile failed" and not self.compile_failure_said and app.session is not None:
            self.compile_failure_said = True
            app.say(f"The compiled step is not available here ({app.session.compile_error}); "
                    "replies use the plain step.", "warning")

    def forget_stats(self) -> None:
        """Another model or chat: the last reply's numbers are not this one's."""
        self.last_stats, self.compile_failure_said = None, False
        self.app.status.show(tok_s=None, ttft_ms=None, window=None)
