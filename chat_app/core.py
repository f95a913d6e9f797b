"""ChatCore: the state every part of the chat's controller shares, and the moves they share.

Contract: one ChatCore per app. It holds the store and its writer, the view (chat_app.view),
the session's worker and the session that answers (None while a model opens), the one
`Turn` (chat_app.turn), the last reply's numbers, and the model process's own state (the
first model opening, a restart under way). Its moves are the ones several parts make:
`begin(job)` (a reply asked for: PREFILLING, the status bar says so, the job queued),
`queue(job)` (a model process that ended is started again first, not for another model,
which replaces the process anyway), `stop_reply()`, `new_chat()`, `ended()`, `forget_stats()`, `show_loading()`, and the
notices (`say`: a toast; `note`: a note in the conversation). The parts
(chat_app.models, chats, versions, editing, replies, commands) each take the core and never
each other's owner: no part holds the App, and none imports chat_app.controller. Imports neither
Textual nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chat_app.jobs import Job, NewChat, Reply, Restart, SwitchModel
from chat_app.saving import StoreWriter
from chat_app.turn import Turn, TurnState

if TYPE_CHECKING:
    from chat_app.store import Store
    from chat_app.view import View
    from chat_app.worker import SessionWorker
    from tinyllm.session.chat_events import StepStats
    from tinyllm.session.session_protocol import ModelProcess

PREFILLING = "prefilling"  # the status bar's state from a reply's job until it begins
ENDED = "model process ended"  # the status bar's state once it has


class ChatCore:
    def __init__(self, store: Store, worker: SessionWorker, model_name: str,
                 servers: dict[str, dict[str, Any]]) -> None:
        self.store, self.worker, self.model_name, self.servers = store, worker, model_name, servers
        self.view: View = None  # type: ignore[assignment]  # the screen, once it is mounted
        self.saver = StoreWriter(store, lambda message, severity: self.say(message, severity))
        self.session: ModelProcess | None = None  # the model that answers (None while one opens)
        self.turn = Turn()
        self.last_stats: StepStats | None = None  # the last reply's numbers (/stats)
        self.prefill_tokens = 0  # ... and its prefill
        self.compile_failure_said = False
        self.opening_first = True  # the first model is opening (until it has loaded, or failed to)
        self.restarting = False  # a new model process is being started in place of one that ended
        self.bad_input: str | None = None  # why the first model was refused (main() prints it, exit code 2)

    @property
    def busy(self) -> bool:
        """A send, regenerate, edit or continue is queued or running."""
        return self.turn.busy

    def say(self, message: str, severity: str = "information") -> None:
        self.view.say(message, severity)

    def note(self, message: str, severity: str = "information") -> None:
        self.view.note(message, severity)

    def save(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """One store write (chat_app.saving): a failure is a notice, never a crash."""
        self.saver.save(write, *args, **kwargs)

    def queue(self, job: Job) -> None:
        """A job for the session's worker; a model process that ended is started again first."""
        if not isinstance(job, SwitchModel):
            self.restart_if_ended()
        self.worker.put(job)

    def begin(self, job: Reply) -> None:
        """Queue a job that streams a reply; the status bar says "prefilling" until it begins."""
        if not self.turn.busy:
            self.turn.move(TurnState.PREFILLING)
        self.view.status.show(state=PREFILLING)
        self.queue(job)

    def stop_reply(self) -> None:
        """Esc: the reply asked for stops at its next step (and again at its Prefilled, where it
        had not begun: chat_app.replies)."""
        if self.session is not None and self.turn.busy:
            self.turn.move(TurnState.STOPPING)
            self.session.stop()

    def new_chat(self) -> None:
        """Ctrl+N, /clear: the reply that runs stops, then a new chat (the old one stays saved)."""
        self.stop_reply()
        self.queue(NewChat())

    def ended(self) -> str:
        """Why the model process is gone ("" while it runs, or while a new one starts)."""
        return "" if self.session is None or self.restarting else self.session.ended

    def restart_if_ended(self) -> None:
        """Before a job is queued: a model process that ended is started again first, with the
        chat as saved (not the message being sent: saved already, its job brings it)."""
        if not self.ended():
            return
        self.restarting = True
        self.show_loading(self.model_name)
        self.say("Starting the model process again; the chat so far is reloaded into it.")
        pairs = [("system", self.store.system or "")]
        self.worker.put(Restart(pairs + [(m.role, m.content) for m in self.store.messages()
                                         if m.role != "system" and m is not self.turn.asked]))

    def show_loading(self, name: str) -> None:
        self.view.load_progress.start(name)
        self.view.status.show(state="loading", name=name)

    def show_stats(self, stats: StepStats, state: str) -> None:
        self.view.status.show(state=state, tok_s=stats.tok_per_s, ttft_ms=stats.ttft_ms, window=stats.window,
                              position=stats.position, max_len=stats.max_len, graphs=stats.graphs, step=stats.step)
        self.last_stats = stats
        if stats.step == "compile failed" and not self.compile_failure_said and self.session is not None:
            self.compile_failure_said = True
            self.say(f"The compiled step is not available here ({self.session.compile_error}); "
                     "replies use the plain step.", "warning")

    def forget_stats(self) -> None:
        """Another model or chat: the last reply's numbers are not this one's."""
        self.last_stats, self.compile_failure_said = None, False
        self.view.status.show(tok_s=None, ttft_ms=None, window=None)

    def ready_for_reply(self) -> bool:
        """A model is open and no reply runs; else a notice says which, and False."""
        if self.session is None:
            self.say("The model is still loading (or failed to load).", "warning")
        elif self.busy:
            self.say("A reply is still running: wait for it, or press Esc to stop it.", "warning")
        else:
            return True
        return False
