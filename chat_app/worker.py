"""SessionWorker: the app's one long-lived worker thread, which owns the model session.

Contract: `start(**changes)` runs the worker on a thread the app gives it (`spawn`: Textual's
thread worker "session", exclusive): it opens the session (`open_session(progress=...,
**changes)`: a ModelProcess) and then runs the jobs (chat_app.jobs) the UI thread queues with
`put(job)`, in order, until the app cancels it. A session job runs as `job.run(session)` (a
`Reply` streams); the worker's own are `Params` (a chat's /set values over the launch's,
"thinking" among them where the model's template has that switch), `OpenChat` (a barrier),
`Restart` and `SwitchModel` (another model, opened beside the old one in a new process; the
old one ends only once the new one has loaded, and answers on if it fails). Everything the
worker learns goes to `deliver` (the app's: one Textual message per batch), as typed events
only (chat_app.events): Loaded, Progress, Started (before a reply's first event), the
session's Prefilled / Token / Finished, Done (a job without a reply), Failed (any job: a
ValueError's message as it is, but that its advice to raise --max-len goes where the context
is the model's whole already; else the exception's type and message), LoadFailed (the first
model). Nothing it does raises into Textual. This module imports neither torch nor Textual.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chat_app.events import Done, Failed, Loaded, LoadFailed, Progress, Started
from chat_app.jobs import Job, OpenChat, Params, Reply, Restart, SwitchModel, Task
from tinyllm.formats import hub  # no torch, as the next
from tinyllm.formats.model_files import precheck

if TYPE_CHECKING:
    from tinyllm.session.session_protocol import ModelProcess

Spawn = Callable[[Callable[[Callable[[], bool]], None]], None]  # runs fn(is_cancelled) on a thread


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


class SessionWorker:
    def __init__(self, open_session: Callable[..., ModelProcess], spawn: Spawn,
                 deliver: Callable[[object], None]) -> None:
        self.open_session, self.spawn, self.deliver = open_session, spawn, deliver
        self.jobs: queue.Queue[Job] = queue.Queue()

    def put(self, job: Job) -> None:
        self.jobs.put(job)

    def report_progress(self, progress: Progress) -> None:
        """The loader's progress callback (the worker thread, or the child's reader)."""
        self.deliver(progress)

    def start(self, **changes: Any) -> None:
        self.spawn(lambda cancelled: self._serve(cancelled, **changes))

    def _serve(self, cancelled: Callable[[], bool], **changes: Any) -> None:
        try:
            session = self.open_session(progress=self.report_progress, **changes)
        except Exception as e:  # shown once (bad input: by main()); the app stays up
            self.deliver(LoadFailed(e, f"could not load the model: {e}"))
            return
        self.deliver(Loaded(session))
        try:
            while (switch := self._run_jobs(session, cancelled)) is not None:
                session = self._switch_model(session, switch)
        finally:
            session.close()

    def _run_jobs(self, session: ModelProcess, cancelled: Callable[[], bool]) -> SwitchModel | None:
        """Run jobs until cancelled (None) or until a SwitchModel job (it)."""
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

        while not cancelled():
            try:
                job = self.jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(job, SwitchModel):
                return job
            try:
                match job:
                    case Params(settings=settings):
                        set_params(settings)
                    case OpenChat():
                        pass  # a barrier: every job before it has run
                    case Restart(messages=messages):
                        session.restart(messages, self.report_progress)
                    case Task():
                        job.run(session)
                    case Reply():
                        started = False
                        for event in job.run(session):
                            if not started:  # only now may the UI replace what it shows
                                self.deliver(Started(job))
                                started = True
                            self.deliver(event)
                            if cancelled():
                                session.stop()
                        continue
                self.deliver(Done(job))
            except Exception as e:
                message = advice(str(e), session) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                self.deliver(Failed(job, message))
        return None

    def _switch_model(self, old: ModelProcess, job: SwitchModel) -> ModelProcess:
        """Open the job's model beside the old one; the session that serves from now on."""
        path = job.path
        try:
            if hub.is_hub(path):  # downloaded here, on the worker: the UI stays live meanwhile
                path = str(hub.fetch(path, progress=False))  # (its bars would write on the screen)
                precheck(path)
            new = self.open_session(progress=self.report_progress, path=path, template=None, system=job.system)
        except Exception as e:
            self.deliver(Failed(job, f"could not open {path}: {e} (still chatting with {old.name})"))
            return old
        self.deliver(Loaded(new, switched=True, keep_chat=job.keep_chat))
        old.close()
        return new
