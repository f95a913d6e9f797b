"""Serve one ChatSession over a multiprocessing connection (the app runs it in a child process).

Why a process: decoding and the UI in one process share one GIL. Measured on the 2-core CPU
with the tiny test model, the app decoded at 25-35% of the same session without a UI (the
Markdown rendering and the event loop held the GIL while the decoder waited for it). In its
own process the session decodes as it does alone (docs/INFERENCE.md, "The UI out of the way").

Contract: `main()` is the child's program (the connection's descriptor is argv[1]; open_kwargs
come first on it) and runs `serve(conn, open_kwargs)`. Its stdout and stderr are what the
parent gave it (chat_app.remote_session: session.log or /dev/null, never the terminal). It
opens the session
(`open_session(**open_kwargs)`; `ignore_eos=True` makes replies run to max_tokens, for
benchmarks), then answers messages, all plain picklable data:
  parent -> child   ("job", kind, arg)       kind: send | regenerate | continue | new_chat | system | load
                    ("call", id, name, args)  set_param | set_graphs | stop, answered at once,
                                              also while a reply streams
                    ("quit",)                 the reply under way stops, then the child ends
  child -> parent   ("progress", done, total)  while the model loads: tensors read (at most
                                              every PROGRESS_S, and always the last)
                    ("loaded", state) | ("load_failed", message, bad_input)   bad_input: the
                                              path, files or options are wrong (a ValueError or
                                              FileNotFoundError: one line for the user), not
                                              the machine (out of memory, a crash)
                    ("started", state)        a send/regenerate was accepted; events follow
                    ("events", [event...], state)  Prefilled/Token/Finished (tinyllm.chat_events),
                                              batched (every BATCH_S, and at the end); state
                                              with the batch that holds Finished
                    ("done", state) | ("failed", message)   a job ended
                    ("answer", id, error, state)
                    ("state", state)          a background compile ended (step_kind changed)
When a compile ends, the job loop also runs `session.prepare()` (the compiled step takes over
and its graphs are captured then, between replies, not during the next one).
`open_kwargs["hold"] = n` (tests only) holds each of the first n replies after its first text
until a "stop" call comes (a stop that came before still counts; quitting releases it), so
such a reply cannot end before Esc however fast the machine. `continue` extends the last
reply where it ended (`ChatSession.continue_reply`); its Finished carries the whole reply's text.
`open_kwargs["cap_max_tokens"]` (the app's default limit) lowers max_tokens to the context's
length once the model is open.
`state` is `snapshot(session)`: a dict of the session's public state. Jobs run in order on
the child's main thread; calls run on its reader thread (ChatSession allows those from any
thread).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection

from tinyllm.chat_events import Token

BATCH_S = 0.005  # events go to the parent at most every 5 ms (and at the end of a reply)
PROGRESS_S = 0.05  # load progress goes to the parent at most every 50 ms (and its last step)


def snapshot(session) -> dict:
    s = session
    return dict(name=s.name, device=s.device, dtype=s.dtype, graphs_available=s.graphs_available,
                use_graph=s.use_graph, max_len=s.max_len, model_max_len=s.model_max_len, context_len=len(s.context),
                first_message=s.first_message,
                system=s.system,
                params=asdict(s.params), step_kind=s.step_kind, compile_error=s.compile_error, timeline=s.timeline,
                messages=[(m.role, m.content, m.stopped) for m in s.messages])


def main() -> None:
    """The child's program: serve on the connection whose descriptor is argv[1]; the parent
    sends open_kwargs first."""
    conn = Connection(int(sys.argv[1]))
    serve(conn, conn.recv())


def serve(conn: Connection, open_kwargs: dict) -> None:
    started = time.time()
    from tinyllm.chat import open_session

    imported = time.time()

    ignore_eos = open_kwargs.pop("ignore_eos", False)
    cap = open_kwargs.pop("cap_max_tokens", False)
    holds = open_kwargs.pop("hold", 0)
    hold = threading.Event() if holds else None
    sent = [0.0]

    def progress(done: int, total: int) -> None:
        if done in (0, total) or time.perf_counter() - sent[0] >= PROGRESS_S:
            sent[0] = time.perf_counter()
            conn.send(("progress", done, total))

    try:
        session = open_session(**open_kwargs, progress=progress)
    except (ValueError, FileNotFoundError, PermissionError) as e:  # the parent shows it; nothing else to do here
        conn.send(("load_failed", str(e), True))
        return
    except Exception as e:
        conn.send(("load_failed", f"{type(e).__name__}: {e}", False))
        return
    if ignore_eos:
        session.stop_ids = set()
    session.marks.update(child_started=started, torch_imported=imported)
    if cap and session.params.max_tokens > session.max_len:
        session.set_param("max_tokens", str(session.max_len))
    send_lock = threading.Lock()

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    send(("loaded", snapshot(session)))
    jobs: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(conn, session, jobs, send, hold), daemon=True).start()
    threading.Thread(target=_watch_compile, args=(session, send, jobs), daemon=True).start()
    while (job := jobs.get()) is not None:
        if job[0] in ("send", "regenerate", "continue") and hold is not None:
            holds -= 1
        _run_job(session, *job, send, hold if holds >= 0 else None)


def _read(conn: Connection, session, jobs: queue.Queue, send, hold: threading.Event | None) -> None:
    def stop() -> None:
        session.stop()
        if hold is not None:
            hold.set()

    calls = {"set_param": session.set_param, "set_graphs": session.set_graphs, "stop": stop}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if msg[0] == "quit":
            break
        if msg[0] == "job":
            jobs.put(msg[1:])
            continue
        _, call_id, name, args = msg
        try:
            calls[name](*args)
            error = None
        except ValueError as e:
            error = str(e)
        send(("answer", call_id, error, snapshot(session)))
    stop()  # the parent is gone or quit: a reply under way ends now, so the job loop sees the end
    jobs.put(None)


def _watch_compile(session, send, jobs: queue.Queue) -> None:
    """Each time a background compile ends (the first at start-up, another when a reply asks
    for the other sampler variant): queue a prepare job and tell the parent."""
    while session.compile_started.wait():
        session.compile_started.clear()
        session.wait_compiled()
        jobs.put(("prepare", None))
        send(("state", snapshot(session)))


def _run_job(session, kind: str, arg, send, hold: threading.Event | None = None) -> None:
    if kind == "prepare":  # the server's own job: the parent waits for no answer
        try:
            session.prepare()
        except Exception as e:  # the next reply takes the step over itself, or says why
            print(f"prepare failed: {type(e).__name__}: {e}", flush=True)
        return
    try:
        if kind in ("send", "regenerate", "continue"):
            events = {"send": lambda: session.send(arg), "regenerate": session.regenerate,
                      "continue": session.continue_reply}[kind]()
            send(("started", snapshot(session)))
            batch, last = [], time.perf_counter()
            for event in events:
                batch.append(event)
                now = time.perf_counter()
                held = hold is not None and isinstance(event, Token) and event.text
                if now - last >= BATCH_S or held:
                    send(("events", batch, None))
                    batch, last = [], now
                if held:
                    hold.wait()  # until stop(): the reply cannot end before it
            send(("events", batch, snapshot(session)))
            if hold is not None:
                hold.clear()
        else:
            {"new_chat": lambda _: session.new_chat(), "system": session.set_system,
             "load": session.load_messages}[kind](arg)
        send(("done", snapshot(session)))
    except Exception as e:  # shown by the app, which keeps the conversation
        if not isinstance(e, ValueError):  # a fault, not bad input: its traceback to session.log
            traceback.print_exc()
        send(("failed", str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"))
