"""Serve one ChatSession over a multiprocessing connection (the app runs it in a child process).

Why a process: decoding and the UI in one process share one GIL. Measured on the 2-core CPU
with the tiny test model, the app decoded at 25-35% of the same session without a UI (the
Markdown rendering and the event loop held the GIL while the decoder waited for it). In its
own process the session decodes as it does alone (docs/INFERENCE.md, "The UI out of the way").

Contract: `main()` is the child's program (the connection's descriptor is argv[1]) and runs
`serve(conn, open_kwargs)` with the open_kwargs sent first. Its stdout and stderr are what the
parent gave it (chat_app.remote_session: session.log or /dev/null, never the terminal). It
opens the session (`open_session(**open_kwargs)`; `ignore_eos=True` makes replies run to
max_tokens, for benchmarks; `cap_max_tokens` (the app's default limit) lowers max_tokens to
the context's length), telling the parent how the load goes (Progress: the tensors read,
and the CPU kernels' build, or that it was found built: tinyllm.kernels.cpu_qgemv.on_build), then
answers the messages of tinyllm.session.session_protocol, dispatching each Call through its JOBS
table: REPLY and TASK jobs run in order on the main thread, CALL jobs at once on the reader
thread (ChatSession allows those from any thread). A reply's events go in
batches, at most every BATCH_S, except the batch holding its first text, which goes at once
(time to first token is what the user waits on). Quit, or the parent gone, stops the reply
under way and ends the child. When a compile ends, the job loop also runs `session.prepare()`
(the compiled step takes over and its graphs are captured then, between replies, not during
the next one). A job that fails on a fault (not a ValueError) prints its traceback (to
session.log).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from tinyllm.session.chat_events import Token
from tinyllm.session.session_protocol import (
    JOBS,
    Call,
    Done,
    Events,
    Loaded,
    LoadFailed,
    LoadStep,
    Progress,
    Quit,
    Runs,
    SessionState,
    Started,
    StateChanged,
)

BATCH_S = 0.005  # events go to the parent at most every 5 ms (and at the end of a reply)
PROGRESS_S = 0.05  # load progress goes to the parent at most every 50 ms (and its last step)
PREPARE = "prepare"  # the server's own job, queued when a compile ends: no answer
KERNEL_STEPS: dict[str, LoadStep] = {"building": "kernels", "cached": "kernels cached", "built": "kernels built",
                                     "failed": "kernels failed"}  # tinyllm.kernels.kernel_build's states as load steps


def main() -> None:
    """The child's program: serve on the connection whose descriptor is argv[1]; the parent
    sends open_kwargs first."""
    conn = Connection(int(sys.argv[1]))
    serve(conn, conn.recv())


def serve(conn: Connection, open_kwargs: dict) -> None:
    started = time.time()
    from tinyllm.kernels import cpu_qgemv
    from tinyllm.session.chat import open_session

    imported = time.time()
    ignore_eos = open_kwargs.pop("ignore_eos", False)
    cap = open_kwargs.pop("cap_max_tokens", False)
    sent = [0.0]
    send_lock = threading.Lock()  # the kernels' build reports from a thread of its own

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    def progress(done: int, total: int) -> None:
        if done in (0, total) or time.perf_counter() - sent[0] >= PROGRESS_S:
            sent[0] = time.perf_counter()
            send(Progress(done, total))

    def kernels(b) -> None:  # the CPU kernels' build, from the loading thread or the build's own
        try:
            send(Progress(b.done, b.total, KERNEL_STEPS[b.state], b.seconds, b.compiling))
        except OSError:  # the parent is gone: the build goes on, the load ends at its next message
            pass

    cpu_qgemv.on_build(kernels)
    try:
        session = open_session(**open_kwargs, progress=progress)
    except (ValueError, FileNotFoundError, PermissionError) as e:  # the parent shows it; nothing else to do here
        send(LoadFailed(str(e), True))
        return
    except Exception as e:
        send(LoadFailed(f"{type(e).__name__}: {e}", False))
        return
    finally:
        cpu_qgemv.on_build(None)
    if ignore_eos:
        session.stop_ids = set()
    session.marks.update(child_started=started, torch_imported=imported)
    if cap and session.params.max_tokens > session.max_len:
        session.set_param("max_tokens", str(session.max_len))
    send(Loaded(SessionState.of(session)))
    jobs: queue.Queue[Call | str | None] = queue.Queue()
    threading.Thread(target=_read, args=(conn, session, jobs, send), daemon=True).start()
    threading.Thread(target=_watch_compile, args=(session, send, jobs), daemon=True).start()
    while (job := jobs.get()) is not None:
        if isinstance(job, Call):
            _run(session, job, send)
        else:
            _prepare(session)


def _read(conn: Connection, session, jobs: queue.Queue, send) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if isinstance(msg, Quit):
            break
        if JOBS[msg.job] is not Runs.CALL:
            jobs.put(msg)
            continue
        try:
            getattr(session, msg.job)(*msg.args)
            error = None
        except ValueError as e:
            error = str(e)
        send(Done(msg.id, error, SessionState.of(session)))
    session.stop()  # the parent is gone or quit: a reply under way ends now, so the job loop sees the end
    jobs.put(None)


def _watch_compile(session, send, jobs: queue.Queue) -> None:
    """Each time a background compile ends (the first at start-up, another when a reply asks
    for the other sampler variant): queue a prepare job and tell the parent."""
    while session.compile_started.wait():
        session.compile_started.clear()
        session.wait_compiled()
        jobs.put(PREPARE)
        send(StateChanged(SessionState.of(session)))


def _prepare(session) -> None:
    try:
        session.prepare()
    except Exception as e:  # the next reply takes the step over itself, or says why
        print(f"prepare failed: {type(e).__name__}: {e}", flush=True)


def _run(session, call: Call, send) -> None:
    """One REPLY or TASK job, answered as tinyllm.session.session_protocol says."""
    try:
        result = getattr(session, call.job)(*call.args)
        if JOBS[call.job] is Runs.REPLY:
            send(Started(call.id, SessionState.of(session)))
            batch, last, texted = [], time.perf_counter(), False
            for event in result:
                batch.append(event)
                now = time.perf_counter()
                first_text = not texted and isinstance(event, Token) and bool(event.text)
                texted = texted or first_text
                if now - last >= BATCH_S or first_text:
                    send(Events(call.id, batch))
                    batch, last = [], now
            send(Events(call.id, batch, SessionState.of(session)))
        send(Done(call.id, None, SessionState.of(session)))
    except Exception as e:  # shown by the app, which keeps the conversation
        if not isinstance(e, ValueError):  # a fault, not bad input: its traceback to session.log
            traceback.print_exc()
        send(Done(call.id, str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}", None))
