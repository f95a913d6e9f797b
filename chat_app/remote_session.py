"""RemoteSession: ChatSession's interface, served by a child process (tinyllm.chat_server).

The app's worker thread uses it as it would a ChatSession: `send(text)` / `regenerate()`
(and `continue_reply()`) return the reply's events (Prefilled, Token, Finished from tinyllm.chat_events, which import
no torch), `new_chat()`, `set_system()` and `load_messages()` block until done, and `stop()`,
`set_graphs()` and `set_param()` take effect at once, from any thread, also mid-reply. Errors
come back as ValueError with the child's message. The public attributes (`name`, `device`,
`messages`, `params`, `step_kind`, ...) mirror the child's session as of its last message.

The child is a new Python (`tinyllm.chat_server.main`, in a session of its own; POSIX) and the
parent never imports torch for it. Its stdout and stderr are `open_kwargs["log"]` (session.log
in the data folder) from before its first instruction, so nothing it prints, an import error
or a traceback before its server loop included, ever reaches the terminal under the TUI. A log
that cannot be opened is /dev/null instead, and `log_error` says why ("" otherwise).
A reader thread owns the receiving end:
replies go to the job that waits for them, call answers to their caller, state updates apply
at once. `close()` ends the child (it stops a reply under way first) and wakes any thread
waiting on the session with ValueError: quitting never waits on a reply, even a hung one.

`RemoteSession(open_kwargs, progress=None, **changes)` opens the session with open_kwargs
updated by `changes` (another path, say) and returns once it is loaded, calling
`progress(done, total)` (tensors read) meanwhile from the opening thread. A model that cannot
be opened raises ValueError when the path, files or options are wrong (the child's one-line
message) and RuntimeError when the machine is (out of memory, the process died). `path` is
the model's path, `pid` the child's process id. `ended` says why the child is gone (killed,
crashed, closed), "" while it runs; `restart(messages)` then starts a new one in its place
(the same object: whoever holds the session keeps it).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from tinyllm.chat_events import Finished, Message, StepStats

CALL_TIMEOUT_S = 30


class Params(SimpleNamespace):
    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in vars(self).items())


class RemoteSession:
    def __init__(self, open_kwargs: dict[str, Any], progress: Callable[[int, int], None] | None = None,
                 **changes: Any):
        self.open_kwargs = {**open_kwargs, **changes}
        self.path = str(self.open_kwargs["path"])
        self.last_stats: StepStats | None = None
        self._start(progress)

    def _start(self, progress: Callable[[int, int], None] | None) -> None:
        """Start the child, wait until its session is loaded, then read what it sends."""
        kwargs = dict(self.open_kwargs)
        log = kwargs.pop("log", None)
        self.log_error = ""  # why the log could not be opened ("": it was, or none was asked)
        try:
            out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (the child's now)
        except OSError as e:
            out, self.log_error = subprocess.DEVNULL, f"{log} cannot be written ({e.strerror or e})"
        self._conn, child_conn = mp.Pipe()
        program = f"import sys; sys.path = {sys.path!r}; from tinyllm.chat_server import main; main()"
        try:  # a session of its own: no signal meant for the terminal's programs reaches it
            self._proc = subprocess.Popen([sys.executable, "-u", "-c", program, str(child_conn.fileno())],
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                          pass_fds=(child_conn.fileno(),), start_new_session=True)
        finally:
            child_conn.close()
            if out is not subprocess.DEVNULL:
                out.close()
        self.pid = self._proc.pid
        self._ended = ""  # why the child is gone, once it is
        self._compiled = threading.Event()
        self._job: queue.SimpleQueue = queue.SimpleQueue()  # what the running job hears
        self._answers: dict[int, queue.SimpleQueue] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._send(kwargs)
        while (first := self._recv())[0] == "progress":
            if progress is not None:
                progress(first[1], first[2])
        if first[0] in ("load_failed", "ended"):
            self.close()
            raise (ValueError if first[0] == "load_failed" and first[2] else RuntimeError)(first[1])
        self._apply(first[1])
        threading.Thread(target=self._read, daemon=True, name="tinyllm-session-reader").start()

    # ---- state ---------------------------------------------------------------------------

    def _apply(self, state: dict | None) -> None:
        if state is None:
            return
        self.__dict__.update({k: v for k, v in state.items() if k not in ("params", "messages")})
        self.params = Params(**state["params"])
        self.messages = [Message(role, content, stopped=stopped) for role, content, stopped in state["messages"]]
        if self.step_kind in ("compiled", "native", "compile failed", "plain"):
            self._compiled.set()

    @property
    def ended(self) -> str:
        """Why the child is gone ("the model process ended (exit code -9)"); "" while it runs."""
        return self._ended

    def restart(self, messages: list[tuple[str, str]], progress: Callable[[int, int], None] | None = None) -> None:
        """After the child ended: a new one with the same options and the old one's settings
        and graphs switch (as last mirrored), the conversation `messages` loaded into it."""
        params, use_graph = {k: "none" if v is None else str(v) for k, v in vars(self.params).items()}, self.use_graph
        self.close()  # reaps the old one
        self._start(progress)
        for name, value in params.items():
            self.set_param(name, value)
        if self.graphs_available and self.use_graph != use_graph:
            self.set_graphs(use_graph)
        self.load_messages(messages)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        return self._compiled.wait(timeout)

    # ---- the connection --------------------------------------------------------------------

    def _recv(self) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            return ("ended", f"the model process ended (exit code {code})")

    def _send(self, msg) -> None:
        with self._send_lock:
            try:
                self._conn.send(msg)
            except OSError:
                raise ValueError("the model process is not running") from None

    def _read(self) -> None:
        while True:
            msg = self._recv()
            kind = msg[0]
            if kind == "answer":
                _, call_id, error, state = msg
                self._apply(state)
                self._answers.pop(call_id).put(error)
            elif kind == "state":
                self._apply(msg[1])
            elif kind == "ended":  # whatever waits hears it, now and later
                self._job.put(("failed", msg[1]))
                for answer in list(self._answers.values()):
                    answer.put(msg[1])
                self._ended = msg[1]  # last: once it shows, this thread touches nothing more (restart())
                return
            else:
                self._job.put(msg)

    def _call(self, name: str, *args, wait: bool = True) -> None:
        call_id, answer = next(self._ids), queue.SimpleQueue()
        self._answers[call_id] = answer
        self._send(("call", call_id, name, args))
        if not wait:
            return
        try:
            error = answer.get(timeout=CALL_TIMEOUT_S)
        except queue.Empty:
            raise ValueError("the model process did not answer") from None
        if error is not None:
            raise ValueError(error)

    def _wait(self) -> tuple:
        if self._ended:
            raise ValueError(self._ended)
        msg = self._job.get()
        if msg[0] == "failed":
            raise ValueError(msg[1])
        return msg

    # ---- ChatSession's interface -----------------------------------------------------------

    def send(self, text: str) -> Iterator:
        return self._reply(("job", "send", text))

    def regenerate(self) -> Iterator:
        return self._reply(("job", "regenerate", None))

    def continue_reply(self) -> Iterator:
        """Extend the last reply (its Finished carries the whole reply's text)."""
        return self._reply(("job", "continue", None))

    def _reply(self, job: tuple) -> Iterator:
        self._send(job)
        self._apply(self._wait()[1])  # "started": accepted (or ValueError, before any event)
        return self._events()

    def _events(self) -> Iterator:
        while True:
            msg = self._wait()
            if msg[0] == "done":
                self._apply(msg[1])
                return
            _, events, state = msg
            self._apply(state)
            for event in events:
                if isinstance(event, Finished):
                    self.last_stats = event.stats
                yield event

    def _job_done(self, kind: str, arg=None) -> None:
        self._send(("job", kind, arg))
        self._apply(self._wait()[1])

    def new_chat(self) -> None:
        self._job_done("new_chat")

    def set_system(self, text: str | None) -> None:
        self._job_done("system", text)

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        self._job_done("load", messages)

    def set_param(self, name: str, value: str) -> None:
        self._call("set_param", name, value)

    def set_graphs(self, on: bool) -> None:
        self._call("set_graphs", on)

    def stop(self) -> None:
        """Ask the reply to finish after the current token (no wait for the answer)."""
        self._call("stop", wait=False)

    @property
    def context(self) -> range:
        """Only its length is mirrored (the ids stay in the child)."""
        return range(self.context_len)

    def close(self) -> None:
        self._ended = self._ended or "the session is closed"
        self._job.put(("failed", self._ended))  # a job waiting for the child's reply hears it now
        try:
            self._send(("quit",))
        except ValueError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
