"""RemoteSession: a Session (tinyllm.session.session_protocol) served by a child process (tinyllm.session.chat_server).

The app's worker thread uses it as it would a ChatSession: `send(text)` / `edit(text)` /
`regenerate()` / `continue_reply()` return the reply's events (Prefilled, Token, Finished from
tinyllm.session.chat_events, which import no torch), `new_chat()`, `set_system()` and
`load_messages()` block until done, and `stop()`, `set_graphs()`, `set_thinking()` and `set_param()` take
effect at once, from any thread, also mid-reply. Each is one Call through the protocol's JOBS
table. Errors come back as ValueError with the child's message. The session's public state
(`name`, `device`, `messages`, `params`, `step_kind`, ...) is `state`, a SessionState as of the
child's last message, read through properties of the same names.

The child is a new Python (`tinyllm.session.chat_server.main`, in a session of its own; POSIX) and the
parent never imports torch for it. Its stdout and stderr are `open_kwargs["log"]` (session.log
in the data folder) from before its first instruction, so nothing it prints, an import error
or a traceback before its server loop included, ever reaches the terminal under the TUI. A log
that cannot be opened is /dev/null instead, and `log_error` says why ("" otherwise).
A reader thread owns the receiving end: each answer goes to the call it answers (by id), state
changes apply at once. `close()` ends the child (it stops a reply under way first; a child that
does not end within 5 s, frozen say, is killed) and wakes every thread waiting on the session
with ValueError: quitting never waits on a reply, even a hung one.

`RemoteSession(open_kwargs, progress=None, **changes)` opens the session with open_kwargs
updated by `changes` (another path, say) and returns once it is loaded, calling
`progress(Progress)` (tensors read, the CPU kernels' build: tinyllm.session.session_protocol) meanwhile
from the opening thread. A model that cannot
be opened raises ValueError when the path, files or options are wrong (the child's one-line
message) and RuntimeError when the machine is (out of memory, the process died). `path` is
the model's path, `pid` the child's process id. `ended` says why the child is gone (killed,
crashed, closed), "" while it runs; `restart(messages)` then starts a new one in its place
(the same object: whoever holds the session keeps it), with the old one's settings and thinking switch.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from tinyllm.decode.sampling_params import SamplingParams
from tinyllm.session.session_protocol import (
    DONE_COMPILING,
    JOBS,
    Call,
    Capabilities,
    Done,
    Ended,
    Event,
    Events,
    Job,
    LoadFailed,
    Progress,
    Quit,
    Runs,
    SessionState,
    StateChanged,
)

CALL_TIMEOUT_S = 30
CLOSE_WAIT_S = 5  # a child that has not ended this long after Quit is killed


def python(code: str, fd: int) -> list[str]:
    """The command line of a new Python with this one's sys.path, running `code` with the
    connection's descriptor `fd` as argv[1]."""
    return [sys.executable, "-u", "-c", f"import sys; sys.path = {sys.path!r}; {code}", str(fd)]


def _mirrored(name: str) -> Any:
    return property(lambda self: getattr(self.state, name), doc=f"the child session's {name} (as last sent)")


class RemoteSession:
    name = _mirrored("name")
    device = _mirrored("device")
    dtype = _mirrored("dtype")
    weights = _mirrored("weights")
    graphs_available = _mirrored("graphs_available")
    use_graph = _mirrored("use_graph")
    max_len = _mirrored("max_len")
    model_max_len = _mirrored("model_max_len")
    first_message = _mirrored("first_message")
    system = _mirrored("system")
    params = _mirrored("params")
    messages = _mirrored("messages")
    step_kind = _mirrored("step_kind")
    compile_error = _mirrored("compile_error")
    timeline = _mirrored("timeline")
    last_stats = _mirrored("last_stats")
    family = _mirrored("family")
    thinking = _mirrored("thinking")
    context_note = _mirrored("context_note")

    @property
    def capabilities(self) -> Capabilities:
        """A local model: its own context, and a graphs switch where it has graphs."""
        return Capabilities(served=False, graphs=self.graphs_available, context=self.max_len)

    def __init__(self, open_kwargs: dict[str, Any], progress: Callable[[Progress], None] | None = None,
                 **changes: Any):
        self.open_kwargs = {**open_kwargs, **changes}
        self.path = str(self.open_kwargs["path"])
        self._lock = threading.Lock()  # the pending calls and `_ended` change together
        self._send_lock = threading.Lock()  # one message at a time on the pipe (a big one is two writes)
        self._start(progress)

    def _command(self, fd: int) -> list[str]:
        """The child's command line."""
        return python("from tinyllm.session.chat_server import main; main()", fd)

    def _start(self, progress: Callable[[Progress], None] | None) -> None:
        """Start the child, wait until its session is loaded, then read what it sends."""
        kwargs = dict(self.open_kwargs)
        log = kwargs.pop("log", None)
        self.log_error = ""  # why the log could not be opened ("": it was, or none was asked)
        try:
            out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (the child's now)
        except OSError as e:
            out, self.log_error = subprocess.DEVNULL, f"{log} cannot be written ({e.strerror or e})"
        self._conn, child_conn = mp.Pipe()
        try:  # a session of its own: no signal meant for the terminal's programs reaches it
            self._proc = subprocess.Popen(self._command(child_conn.fileno()), stdin=subprocess.DEVNULL,
                                          stdout=out, stderr=out, pass_fds=(child_conn.fileno(),),
                                          start_new_session=True)
        finally:
            child_conn.close()
            if out is not subprocess.DEVNULL:
                out.close()
        self.pid = self._proc.pid
        self._ended = ""  # why the child is gone, once it is
        self._compiled = threading.Event()
        self._pending: dict[int, queue.SimpleQueue] = {}  # call id -> what answers it
        self._ids = itertools.count()
        self._send(kwargs)
        while isinstance(first := _recv(self._conn, self._proc), Progress):
            if progress is not None:
                progress(first)
        if isinstance(first, LoadFailed | Ended):
            self.close()
            bad = isinstance(first, LoadFailed) and first.bad_input
            raise (ValueError if bad else RuntimeError)(first.message if isinstance(first, LoadFailed) else first.reason)
        self._apply(first.state)
        threading.Thread(target=self._read, args=(self._conn, self._proc, self._pending), daemon=True,
                         name="tinyllm-session-reader").start()

    # ---- state ---------------------------------------------------------------------------

    def _apply(self, state: SessionState | None) -> None:
        if state is None:
            return
        self.state = state
        if state.step_kind in DONE_COMPILING:
            self._compiled.set()

    @property
    def context(self) -> range:
        """Only its length is mirrored (the ids stay in the child)."""
        return range(self.state.context_len)

    @property
    def ended(self) -> str:
        """Why the child is gone ("the model process ended (exit code -9)"); "" while it runs."""
        return self._ended

    def restart(self, messages: list[tuple[str, str]], progress: Callable[[Progress], None] | None = None) -> None:
        """After the child ended: a new one with the same options and the old one's settings
        and graphs switch (as last mirrored), the conversation `messages` loaded into it."""
        params, use_graph = {k: "none" if v is None else str(v) for k, v in vars(self.params).items()}, self.use_graph
        thinking = self.thinking
        self.close()  # reaps the old one
        self._start(progress)
        for name, value in params.items():
            self.set_param(name, value)
        if thinking is not None and self.thinking is not None and self.thinking != thinking:
            self.set_thinking(thinking)
        if self.use_graph != use_graph:  # graphs, or on a CPU the native step
            self.set_graphs(use_graph)
        self.load_messages(messages)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        return self._compiled.wait(timeout)

    # ---- the connection --------------------------------------------------------------------

    def _send(self, msg: Any) -> None:
        try:
            with self._send_lock:
                self._conn.send(msg)
        except OSError:
            raise ValueError("the model process is not running") from None

    def _read(self, conn: Connection, proc: subprocess.Popen, pending: dict[int, queue.SimpleQueue]) -> None:
        """This child's answers to their calls, until it is gone (its own conn, proc and
        pending: after restart() they are another child's)."""
        while not isinstance(msg := _recv(conn, proc), Ended):
            if isinstance(msg, StateChanged):
                self._apply(msg.state)
                continue
            with self._lock:  # none after close(), which woke every waiting call
                answers = pending.pop(msg.id, None) if isinstance(msg, Done) else pending.get(msg.id)
            if answers is not None:
                answers.put(msg)
        self._end(msg.reason, pending)

    def _end(self, reason: str, pending: dict[int, queue.SimpleQueue]) -> None:
        """Whatever waits on the child hears that it is gone, now and later."""
        with self._lock:
            self._ended = self._ended or reason
            waiting = list(pending.values())
            pending.clear()
        for answers in waiting:
            answers.put(Ended(self._ended))

    def _call(self, job: Job, *args: Any) -> queue.SimpleQueue:
        """Send the call; the queue its answers come to."""
        answers: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self._ended:
                raise ValueError(self._ended)
            call_id = next(self._ids)
            self._pending[call_id] = answers
        self._send(Call(call_id, job, args))
        return answers

    @staticmethod
    def _next(answers: queue.SimpleQueue, timeout: float | None = None) -> Any:
        try:
            msg = answers.get(timeout=timeout)
        except queue.Empty:
            raise ValueError("the model process did not answer") from None
        if isinstance(msg, Ended):
            raise ValueError(msg.reason)
        if isinstance(msg, Done) and msg.error is not None:
            raise ValueError(msg.error)
        return msg

    def _run(self, job: Job, *args: Any) -> Any:
        """One job, as JOBS says it runs: a REPLY's events, or None once a TASK or CALL is done."""
        answers = self._call(job, *args)
        runs = JOBS[job]
        msg = self._next(answers, CALL_TIMEOUT_S if runs is Runs.CALL else None)
        self._apply(msg.state)  # Started (accepted: events follow), or Done
        return self._events(answers) if runs is Runs.REPLY else None

    def _events(self, answers: queue.SimpleQueue) -> Iterator[Event]:
        while not isinstance(msg := self._next(answers), Done):
            assert isinstance(msg, Events), f"a reply's answer: {msg!r}"
            self._apply(msg.state)
            yield from msg.events
        self._apply(msg.state)

    # ---- the Session ---------------------------------------------------------------------

    def send(self, text: str) -> Iterator[Event]:
        return self._run("send", text)

    def edit(self, text: str) -> Iterator[Event]:
        """The last user turn and its reply replaced by `text`, and its reply."""
        return self._run("edit", text)

    def regenerate(self, params: SamplingParams | None = None) -> Iterator[Event]:
        """A new last reply; `params`: its settings, where given (the chat's stay)."""
        return self._run("regenerate", *(() if params is None else (params,)))

    def continue_reply(self) -> Iterator[Event]:
        """Extend the last reply (its Finished carries the whole reply's text)."""
        return self._run("continue_reply")

    def new_chat(self) -> None:
        self._run("new_chat")

    def set_system(self, text: str | None) -> None:
        self._run("set_system", text)

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        self._run("load_messages", messages)

    def set_param(self, name: str, value: str) -> None:
        self._run("set_param", name, value)

    def set_graphs(self, on: bool) -> None:
        self._run("set_graphs", on)

    def set_thinking(self, on: bool) -> None:
        self._run("set_thinking", on)

    def stop(self) -> None:
        """Ask the reply to finish after the current token (no wait for the answer). A child
        that is gone has no reply to stop."""
        try:
            self._call("stop")
        except ValueError:
            pass

    def close(self) -> None:
        self._end("the session is closed", self._pending)  # a job waiting for the child's reply hears it now
        try:
            self._send(Quit())
        except ValueError:
            pass
        try:
            self._proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=CLOSE_WAIT_S)


def _recv(conn: Connection, proc: subprocess.Popen) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):
        try:
            code = proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        return Ended(f"the model process ended (exit code {code})")
