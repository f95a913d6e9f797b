"""One message without the app: `tinyllm-chat -p PROMPT`, or text on stdin (chat_app.__main__
builds the message: stdin and the -f files, fenced, before -p's text).

Contract: `run(args, message, argv) -> exit code`. No window, no escape codes, no colour: the reply
goes to stdout as it streams, its control characters made visible by the app's one rule
(chat_app.labels.printable: ESC is "␛", C1 controls U+FFFD; tab and newline kept), to a file, a
pipe and a terminal alike; it ends with a newline. `--json` writes JSON lines instead, the
reply's text exact (JSON escapes every control character, DEL and C1 too):
  {"event": "prefilled", "prompt_tokens": N, "ms": F, "dropped": N}
  {"event": "token", "text": S}                                   one per piece of text
  {"event": "finished", "reason": R, "text": S, "prompt_tokens": N, "reply_tokens": N,
   "tok_s": F, "ttft_ms": F, "position": N, "context": N, "model": S, "chat": ID or null}
R is the session's (eos, max_tokens, stopped, context_full, repeating) or "error". stderr
carries only one-line notes and errors (`tinyllm-chat: note: ...`, `tinyllm-chat: error: ...`).

A local model runs in this process (its ChatSession: no model process, which costs about as
much CPU again before the first token and ends later; scripts/oneshot_startup.py measures both
against the library alone, docs/BENCHMARKS.md); a server, through chat_app.server_session.
The chat is saved as the app saves it (chat_app.store: the message before the model sees it,
the reply as it streams, marked partial, then final), unless --no-save. --resume and --chat ID
continue a saved chat with its model, system prompt and /set values; options given on the
command line win over the chat's values.

Exit codes: 0 the reply ended (at the end of its text, at max_tokens or at a repetition: the
last two said in a note); 1 it failed (the model or the server: one line, what came is kept,
marked stopped) or something unexpected (one line, the traceback in tinyllm-chat.log); 2 bad
input (an option, the model, a file, stdin, a chat id, a message longer than the context:
nothing sent, one line saying by how much; a reply that filled the context: kept, one line);
130 Ctrl+C, 143 SIGTERM, 129 SIGHUP: the reply stops, what came is printed and kept (a second
Ctrl+C ends at once); 141 stdout was closed (`| head`): the reply stops and is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chat_app.labels import printable

if TYPE_CHECKING:
    from chat_app.settled import Settled

PROG = "tinyllm-chat"  # as chat_app.__main__ names it

SAVE_EVERY_S = 1.0  # a streaming reply's text is written to chat.db this often (a kill loses less)
_JSON_CONTROLS = {c: f"\\u{c:04x}" for c in range(0x7F, 0xA0)}  # json.dumps leaves DEL and C1 as they are


class Failed(Exception):
    """An end that is one line on stderr and an exit code."""

    def __init__(self, message: str, code: int, kind: str = "error") -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


def run(args: argparse.Namespace, message: str, given: set[str], settle: Callable[[], Settled]) -> int:
    """`given`: the options the command line gives (they win over a resumed chat's); `settle`:
    chat_app.__main__.settle for this command line. Anything unexpected is raised, for main()'s
    one line and log."""
    if args.resume and args.chat is not None:
        return _say("--resume and --chat both name a chat to continue; give one", 2)
    try:
        reply = Reply(args, message, given, settle)
    except Failed as e:
        return _say(str(e), e.code, e.kind)
    except (FileNotFoundError, PermissionError, ValueError) as e:
        return _say(str(e), 2)
    except KeyboardInterrupt:
        return _say("interrupted before the reply began", 130)
    try:
        return reply.run()
    except BaseException:
        reply.close()
        raise


def _say(line: str, code: int, kind: str = "error") -> int:
    print(f"{PROG}: {kind}: {line}", file=sys.stderr, flush=True)
    return code


class Reply:
    """One message and its reply: the session opened, the chat continued, the reply streamed."""

    def __init__(self, args: argparse.Namespace, message: str, given: set[str], settle: Callable[[], Settled]) -> None:
        self.args, self.message, self.json = args, message, args.json
        self.out = sys.stdout.buffer
        s = settle()
        self.store, self.name, self.server = s.store, s.name, s.server
        self.store_said = False
        resumed = s.resumed
        if resumed is not None and resumed.error:
            raise Failed(resumed.error, 2)
        if resumed is not None and resumed.held:
            raise Failed("the last chat is open in another tinyllm-chat: close it there, or pass --chat ID", 2)
        if resumed is not None and resumed.notice:
            _say(resumed.notice, 0, "note")
        if args.resume and resumed is not None and not resumed.saved:
            _say("no saved chat to resume: this is a new one", 0, "note")
        self.session: Any = s.server if s.server is not None else open_local(s.local)
        if resumed is not None and resumed.saved and self.store is not None:
            self._continue(self.store, given)
        if args.no_save and self.store is not None:  # it was opened to read the chat: nothing goes back
            self.store.close()
            self.store = None

    def _continue(self, store, given: set[str]) -> None:
        """The saved chat into the session: its system prompt, messages and /set values (those the
        command line does not give)."""
        session = self.session
        session.load_messages([("system", store.system or "")] +
                              [(m.role, m.content) for m in store.messages() if m.role != "system"])
        for name, value in store.settings.items():
            if name in given:
                continue
            try:
                if name == "thinking":
                    if session.thinking is not None and value in ("on", "off"):
                        session.set_thinking(value == "on")
                else:
                    session.set_param(name, value)
            except ValueError as e:
                _say(f"a setting saved with this chat was skipped: {e}", 0, "note")
        if "system" in given and self.args.system != store.system:
            session.set_system(self.args.system)
            self._save(store.set_system, self.args.system)

    # ---- the reply --------------------------------------------------------------------------

    def run(self) -> int:
        from chat_app.store import Saved

        stops = Stops(self.session)
        asked = Saved("user", self.message)
        self._save(self.store and self.store.add, asked)  # before the model sees it
        if self.args.prompt and self.args.prompt.strip():  # what was typed (not stdin, not -f): the app's Up finds it
            self._save(self.store and self.store.add_prompt, self.args.prompt)
        try:
            events = self.session.send(self.message)
        except ValueError as e:  # refused (too long, empty): nothing sent
            self._save(self.store and self.store.drop, asked)
            stops.restore()
            self.close()
            return _say(str(e), 2)  # too long: it says by how many tokens
        row = Saved("assistant", "", partial=True, model=self.name)
        self._save(self.store and self.store.add, row)
        text: list[str] = []
        prefill, saved_at, finished, failure, began = 0, time.monotonic(), None, None, False
        try:
            for event in events:
                stops.again()
                kind = type(event).__name__
                if kind == "Prefilled":
                    prefill, began = event.n_tokens, True
                    if event.dropped:
                        _say(f"the oldest {event.dropped} messages of this chat no longer fit the context: "
                             "the model did not see them", 0, "note")
                    self._emit({"event": "prefilled", "prompt_tokens": event.n_tokens, "ms": round(event.ms, 1),
                                "dropped": event.dropped})
                elif kind == "Token":
                    if event.text:
                        text.append(event.text)
                        self._emit({"event": "token", "text": event.text}, event.text)
                    if self.store is not None and time.monotonic() - saved_at >= SAVE_EVERY_S:
                        saved_at = time.monotonic()
                        self._save(self.store.update, row, "".join(text), partial=True)
                elif kind == "Finished":
                    finished = event
        except BrokenPipeError:
            stops.closed()
        except KeyboardInterrupt:  # the second Ctrl+C: at once
            stops.signal = stops.signal or signal.SIGINT
        except ValueError as e:  # the model or the server failed mid-reply (a server: before it too)
            failure = str(e)
        except Exception as e:  # what nothing expects (a local model's CUDA out of memory): its traceback logged
            from chat_app import crash_log

            where = crash_log.log(e, self.store.folder if self.store is not None else None)
            first = (str(e).splitlines() or [""])[0]
            failure = f"the model failed mid-reply: {type(e).__name__}: {first} ({where})"
        stops.restore()
        said = finished.text if finished is not None else "".join(text)
        if failure is not None and not began and not text:  # refused before the reply began: nothing said
            self._save(self.store and self.store.drop, row)
            self._save(self.store and self.store.drop, asked)
            self.close()
            return 128 + stops.signal if stops.signal is not None else _say(failure, 1)
        self._save(self.store and self.store.update, row, said, partial=False,
                   stopped=finished is None or finished.reason == "stopped")
        reason = "error" if failure else finished.reason if finished else "stopped"
        if finished is None and stops.signal is None and not stops.pipe_closed and failure is None:
            failure = "the reply ended without its end"
        if not stops.pipe_closed:
            self._end(said, reason, prefill, finished)
        self.close()
        return self._code(stops, failure, reason, finished)

    def _code(self, stops: Stops, failure: str | None, reason: str, finished: Any) -> int:
        if stops.pipe_closed:
            return 141
        if stops.signal is not None:
            return 128 + stops.signal
        if failure is not None:
            return _say(failure, 1)
        if reason == "context_full":
            return _say(f"the reply filled the context ({finished.stats.max_len:,} positions) and was cut "
                        "there; shorten the message or raise --max-len", 2)
        if reason == "max_tokens":
            _say(f"the reply reached max_tokens ({finished.stats.tokens:,}) and ends there; --max-tokens N "
                 "allows more", 0, "note")
        if reason == "repeating":
            _say("the reply was saying the same thing again and again and was stopped there; --repeat-stop off "
                 "turns this off", 0, "note")
        return 0

    def _end(self, said: str, reason: str, prefill: int, finished: Any) -> None:
        if not self.json:
            self._write("" if said.endswith("\n") else "\n")
            return
        stats = finished.stats if finished is not None else getattr(self.session, "last_stats", None)
        line: dict[str, Any] = {"event": "finished", "reason": reason, "text": said, "prompt_tokens": prefill}
        if stats is not None:
            line.update(reply_tokens=stats.tokens, tok_s=round(stats.tok_per_s, 2), ttft_ms=round(stats.ttft_ms, 1),
                        position=stats.position, context=stats.max_len)
        chat = self.store.conversation if self.store is not None else None
        self._emit(dict(line, model=self.name, chat=chat))

    # ---- output and saving --------------------------------------------------------------------

    def _emit(self, line: dict[str, Any], text: str | None = None) -> None:
        if self.json:
            self._write(json.dumps(line, ensure_ascii=False).translate(_JSON_CONTROLS) + "\n", raw=True)
        elif text is not None:
            self._write(text)

    def _write(self, text: str, raw: bool = False) -> None:
        self.out.write((text if raw else printable(text)).encode("utf-8", "replace"))
        self.out.flush()

    def _save(self, write: Any, *args: Any, **kwargs: Any) -> None:
        """One store write (none without a store: --no-save); a failure is said once, the chat
        goes on (what chat.db lacks at the end goes to an unsaved-*.md file: `close`)."""
        from chat_app.store import StoreError

        if not write:
            return
        try:
            write(*args, **kwargs)
        except StoreError as e:
            if not self.store_said:
                self.store_said = True
                _say(str(e), 0, "warning")

    def close(self) -> None:
        if self.store is not None:
            farewell = self.store.rescue()
            if farewell:
                print(farewell, file=sys.stderr)
            self.store.close()
            self.store = None
        if self.server is not None:
            self.server.close()


class Stops:
    """Ctrl+C, SIGTERM and SIGHUP stop the reply and keep what came: the handler only sets an Event
    (a stop() called in a signal handler could wait on a lock its own thread holds); a thread
    stops the session, and the loop asks again at each event (a stop before a local reply began
    is kept by it; a server's before it answered raises). A second Ctrl+C ends at once.
    A closed stdout (BrokenPipeError) stops it too."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.signal: int | None = None
        self.pipe_closed = False
        self.wanted = threading.Event()
        self._asked = False
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        threading.Thread(target=self._stop, daemon=True, name="tinyllm-oneshot-stop").start()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = self.signal or signum
        self.wanted.set()

    def _stop(self) -> None:
        self.wanted.wait()
        self.session.stop()

    def again(self) -> None:
        """Between two events: a stop asked for is sent again, once, from this thread."""
        if self.wanted.is_set() and not self._asked:
            self._asked = True
            self.session.stop()

    def closed(self) -> None:
        """stdout is gone: stop, and write nothing more to it."""
        self.pipe_closed = True
        self.wanted.set()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        os.close(devnull)

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def open_local(local: dict[str, Any]) -> Any:
    """A local model's ChatSession, in this process, as the model process opens it
    (tinyllm.session.chat_server: ignore_eos, the default max_tokens capped to the context)."""
    kwargs = dict(local)
    ignore_eos, cap = kwargs.pop("ignore_eos", False), kwargs.pop("cap_max_tokens", False)
    kwargs.pop("log", None)
    from tinyllm.session.chat import open_session

    session = open_session(**kwargs)
    if ignore_eos:
        session.stop_ids = set()
    if cap and session.params.max_tokens > session.max_len:
        session.set_param("max_tokens", str(session.max_len))
    return session
