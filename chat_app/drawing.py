"""Drawing what the app's worker reports, as a mixin of ChatApp (the UI thread).

Contract: a timer drains the worker's outbox at most DRAIN_HZ times a second; the Token
texts drained together are ONE Markdown update, and nothing is dropped. A reply replaces what
is on screen only once it has begun (Started); it is saved as partial at its first text and
then at least every SAVE_EVERY_S, and whole (stopped or not) at its Finished. A failed reply
keeps what streamed, marked; a refused message goes back to the input. The status bar follows
each reply's numbers and a step kind that changed between replies (a compile ended). Nothing
is drawn while the app shuts down.
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
from chat_app.widgets.reply import Reply
from tinyllm.session_protocol import JOBS, Runs

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from tinyllm.chat_events import StepStats

DRAIN_HZ = 30
SAVE_EVERY_S = 1.0  # a streaming reply is written to the store at least this often


def echo(text: str, width: int = 100) -> str:
    """Text a notice repeats back: its first line, at most `width` characters (a notice holding a
    whole long system prompt covered the screen)."""
    line = text.strip().split("\n", 1)[0]
    if line == text.strip() and len(line) <= width:
        return line
    return f"{line[:width - 1].rstrip()}… ({len(text):,} characters)"


def streams(kind: str) -> bool:
    """A job that streams a reply (send, regenerate, continue_reply)."""
    return JOBS.get(kind) is Runs.REPLY  # type: ignore[call-overload]


class Drawing:
    async def _drain(self: ChatApp) -> None:
        try:
            await self._drain_outbox()
        except NoMatches:  # only shutting down removes the app's widgets: nothing left to show
            return

    async def _drain_outbox(self: ChatApp) -> None:
        pieces: list[str] = []
        live: StepStats | None = None
        while self.is_running:  # not while shutting down: the widgets may be gone
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            match item:
                case Token(text=text, stats=stats):
                    pieces.append(text)
                    live = stats
                    continue
            await self._write(pieces)
            pieces = []
            match item:
                case Finished():
                    live = None
                    await self._finished(item)
                case Prefilled():
                    self._prefilled(item)
                case _:
                    await self._handle(item)
        await self._write(pieces)
        if live is not None:
            self._show_stats(live, "generating")
        s = self.session
        self.say_if_ended()
        if s is not None and not self._busy and self.status.fields.get("step") != s.step_kind:
            self.status.show(step=s.step_kind)  # a compile ended between replies: say so now
        if self._row is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save_partial()

    async def _write(self: ChatApp, pieces: list[str]) -> None:
        if pieces and self._reply is not None:
            text = "".join(pieces)
            await self._reply.write(text)
            self._text.append(text)
            if self._saved_at == 0.0:  # the reply's first text is saved at once
                self.save_partial()

    async def _handle(self: ChatApp, item: Loaded | Progress | Started | Done | Failed) -> None:
        match item:
            case Loaded(session=s, switched=switched, keep_chat=keep_chat):
                await self.model_loaded(s, switched, keep_chat)
            case Progress(step="tensors", done=done, total=total):
                self.load_progress.advance(done, total)
            case Progress(step=step, done=done, total=total, seconds=seconds):
                self.load_progress.kernels(step, done, total, seconds)
            case Started():
                await self._started(item)
            case Failed():
                await self._failed(item)
            case Done():
                await self._done(item)

    async def _started(self: ChatApp, item: Started) -> None:
        conversation = self.conversation
        if item.kind == "regenerate":
            await conversation.drop_last_reply()
            last = [m for m in self.store.messages() if m.role != "system"][-1:]
            if last and last[0].role == "assistant":
                self._save(self.store.drop, last[0])
        elif item.kind == "continue_reply":  # the last reply goes on: same widget, same row
            self._reply = conversation.query(Reply).last()
            self._reply.resume()
            self._row = [m for m in self.store.messages() if m.role == "assistant"][-1]
            self._text, self._saved_at = [self._row.content], 0.0
            self.status.show(state="generating")
            return
        else:
            if not await self.waiting_began():  # (a message sent while the model loaded is shown already)
                await conversation.add_user(item.text)
            self._save(self.store.add, Saved("user", item.text))
        self._reply = await conversation.add_reply(self.model_name)
        self._row, self._text, self._saved_at = Saved("assistant", "", partial=True, model=self.model_name), [], 0.0
        self._save(self.store.add, self._row)
        self.status.show(state="generating")

    def _prefilled(self: ChatApp, item: Any) -> None:
        self.prefill_tokens = item.n_tokens
        if self._stop_wanted and self.session is not None:  # Esc came before the reply began: again
            self.session.stop()
        if item.dropped:
            self.say(f"Context full: the oldest {item.dropped} messages no longer reach the model "
                     "(they stay on screen and in the saved chat).", "warning")

    async def _finished(self: ChatApp, item: Any) -> None:
        if self._reply is not None:
            await self._reply.finish(item.reason)
        row = self._row
        self._reply, self._row, self._busy, self._stop_wanted = None, None, False, False
        if row is not None:
            self._save(self.store.update, row, item.text, partial=False, stopped=item.reason == "stopped")
        self._show_stats(item.stats, "ready")
        if item.reason == "context_full":
            self.say(f"The reply filled the context ({item.stats.max_len} positions); "
                     "the next turn drops the oldest messages.", "warning")

    async def _failed(self: ChatApp, item: Failed) -> None:
        if item.kind in ("load", "model", "restart"):
            self.model_failed(item)
            return
        ended = self.ended()  # a reply cut short by it, or a job refused after it: said once, with what comes next
        said = self.note if item.kind == "set_system" else self.say  # /system's refusal is the command's answer
        said(f"{item.message}; the next message starts it again" if ended else item.message, "error")
        if streams(item.kind):
            if self._reply is not None:  # it failed mid-reply: keep what streamed, marked
                await self._reply.finish("error")
                if self._row is not None:
                    self._save(self.store.update, self._row, "".join(self._text), partial=False, stopped=True)
            elif item.kind == "send":
                await self.waiting_refused()
                self.prompt.give_back(item.arg)  # refused before it was shown (or while it waited)
            self._reply, self._row, self._busy, self._stop_wanted = None, None, False, False
            self.status.show(state=ENDED if ended else "ready")

    async def _done(self: ChatApp, item: Done) -> None:
        assert self.session is not None, "jobs run only after the session is loaded"
        if item.kind == "new_chat":
            await self.conversation.clear()
            self.store.new_chat()
            self.status.show(tok_s=None, ttft_ms=None, window=None, position=len(self.session.context))
        elif item.kind == "set_system":
            system = self.session.system
            self._save(self.store.set_system, system)
            if self.session.messages:  # where it was set, as the saved chat shows it again
                await self.conversation.add_note(system_note(system or ""))
            else:  # /system's answer (a command's note: chat_app.commands)
                self.note(f"System prompt set: {echo(system)}" if system else "System prompt cleared.")
        elif item.kind == "load_messages":
            self.status.show(position=len(self.session.context))
        elif item.kind == "restart":
            self.restarted()
            self.say("The model process is running again.")
        elif item.kind == "open":
            await self.open_chat(item.arg)

    def _show_stats(self: ChatApp, stats: StepStats, state: str) -> None:
        self.status.show(state=state, tok_s=stats.tok_per_s, ttft_ms=stats.ttft_ms, window=stats.window,
                         position=stats.position, max_len=stats.max_len, graphs=stats.graphs, step=stats.step)
        self.last_stats = stats
        if stats.step == "compile failed" and not self._compile_failure_said and self.session is not None:
            self._compile_failure_said = True
            self.say(f"The compiled step is not available here ({self.session.compile_error}); "
                     "replies use the plain step.", "warning")
