"""SessionWorker: the app's one long-lived worker thread, which owns the model session.

Contract: `start(**changes)` runs the worker (Textual's thread worker, group "session",
exclusive): it opens the session (`open_session(progress=..., **changes)`: a ModelProcess)
and then runs the jobs the UI thread queues with `put(kind, arg)`, in order, until the app
cancels it. A job is a session job (tinyllm.session.session_protocol's JOBS: the Session method of
that name, called with arg, none when arg is None; a REPLY streams) or one of the app's own:
"params" (a chat's /set values over the launch's, "thinking" among them where the model's
template has that switch), "open" (a barrier before a saved chat
opens), "restart" (a new model process in place of one that ended, reloaded with the given
messages), "model" ((path, system, keep_chat): another model, opened beside the old one in a
new process; the old one ends only once the new one has loaded, and answers on if it fails).
Everything the worker learns goes into `outbox`, as typed events only (chat_app.events):
Loaded, Progress, Started (before a reply's first event), the session's Prefilled / Token /
Finished, Done (a job without a reply), Failed (any job: a ValueError's message as it is, but
that its advice to raise --max-len goes where the context is the model's whole already;
else the exception's type and message). Nothing it does raises into Textual. This module never
imports torch.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.worker import get_current_worker

from chat_app.events import Done, Failed, Loaded, Progress, Started
from tinyllm.formats import hub  # no torch, as the next
from tinyllm.formats.model_files import precheck
from tinyllm.session.session_protocol import JOBS, Runs

if TYPE_CHECKING:
    from textual.app import App

    from tinyllm.session.session_protocol import ModelProcess


THINKING = "thinking"  # the chat's setting ("on" / "off") for the template's thinking switch, not a sampling one


def advice(message: str, session: ModelProcess) -> str:
    """A refusal as the session words it, without "raise --max-len" where the context is the
    model's whole already (nothing a higher --max-len could give): what is left to do, and why."""
    model_max = getattr(session, "model_max_len", None)
    if not isinstance(model_max, int) or session.max_len < model_max or "raise --max-len" not in message:
        return message
    for said in (", or raise --max-len", " or raise --max-len"):
        message = message.replace(said, "")
    return f"{message}; the context is the model's whole {model_max:,} positions already"


def streams(kind: str) -> bool:
    """A job that streams a reply (send, edit, regenerate, continue_reply)."""
    return JOBS.get(kind) is Runs.REPLY  # type: ignore[call-overload]


class SessionWorker:
    def __init__(self, app: App, open_session: Callable[..., ModelProcess]) -> None:
        self.app, self.open_session = app, open_session
        self.jobs: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, kind: str, arg: Any) -> None:
        self.jobs.put((kind, arg))

    def report_progress(self, progress: Progress) -> None:
        """The loader's progress callback (the worker thread, or the child's reader)."""
        self.outbox.put(progress)

    def start(self, **changes: Any) -> None:
        self.app.run_worker(lambda: self._serve(**changes), thread=True, exclusive=True, group="session",
                            name="session")

    def _serve(self, **changes: Any) -> None:
        worker = get_current_worker()
        try:
            session = self.open_session(progress=self.report_progress, **changes)
        except Exception as e:  # shown once (bad input: by main()); the app stays up
            self.outbox.put(Failed("load", e, f"could not load the model: {e}"))
            return
        self.outbox.put(Loaded(session))
        try:
            while (model := self._run_jobs(session, worker)) is not None:
                session = self._switch_model(session, model)
        finally:
            session.close()

    def _run_jobs(self, session: ModelProcess, worker) -> Any:
        """Run jobs until cancelled (None) or until a "model" job (its argument)."""
        launch = {k: "none" if v is None else str(v) for k, v in vars(session.params).items()}
        launch_thinking = getattr(session, "thinking", None)  # None: the template has no switch

        def set_params(settings: dict[str, str]) -> None:  # a chat's /set values over the launch's
            for name, value in {**launch, **settings}.items():
                if name != THINKING:
                    session.set_param(name, value)
            if launch_thinking is not None:  # the template's switch (another model's chat: none here)
                want = launch_thinking if THINKING not in settings else settings[THINKING] == "on"
                if session.thinking != want:
                    session.set_thinking(want)

        own: dict[str, Callable[[Any], None]] = {"params": set_params, "open": lambda _: None,
                                                 "restart": lambda pairs: session.restart(pairs, self.report_progress)}
        while not worker.is_cancelled:
            try:
                kind, arg = self.jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "model":
                return arg
            try:
                if kind in own:
                    own[kind](arg)
                    self.outbox.put(Done(kind, arg))
                    continue
                result = getattr(session, kind)(*(() if arg is None else (arg,)))
                if streams(kind):
                    started = False
                    for event in result:
                        if not started:  # only now may the UI replace what it shows
                            self.outbox.put(Started(kind, arg))
                            started = True
                        self.outbox.put(event)
                        if worker.is_cancelled:
                            session.stop()
                else:
                    self.outbox.put(Done(kind, arg))
            except Exception as e:
                message = advice(str(e), session) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                self.outbox.put(Failed(kind, arg, message))

    def _switch_model(self, old: ModelProcess, job: tuple[str, str | None, bool]) -> ModelProcess:
        """Open the job's model beside the old one; the session that serves from now on."""
        path, system, keep_chat = job
        try:
            if hub.is_hub(path):  # downloaded here, on the worker: the UI stays live meanwhile
                path = str(hub.fetch(path, progress=False))  # (its bars would write on the screen)
                precheck(path)
            new = self.open_session(progress=self.report_progress, path=path, template=None, system=system)
        except Exception as e:
            self.outbox.put(Failed("model", path, f"could not open {path}: {e} (still chatting with {old.name})"))
            return old
        self.outbox.put(Loaded(new, switched=True, keep_chat=keep_chat))
        old.close()
        return new
