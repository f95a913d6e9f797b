"""ServerSession: a Session (tinyllm.session.session_protocol) whose replies come from an
OpenAI-compatible server (chat_app.server_api), in this process: no torch, no model process.

Contract:
- `ServerSession(endpoint, params, system)` asks the server for its models (`models`, for /model's
  completion and the palette) and picks the endpoint's model, else the server's first. A model
  the server does not list is refused (ValueError naming the ones it does), as is a server that
  cannot be reached (chat_app.server_api's one line).
- It keeps the conversation itself (`messages`, `system`, `params`) and sends the whole of it
  with every request: send, edit, regenerate and continue_reply return the reply's events as a
  local session does, so the app's worker, drawer and store treat both alike:
    Prefilled(0, ms)       the server accepted the request (200, the stream open); ms since it was sent
    Token(text, stats)     one streamed delta: TEXT, not a token id (a server sends text; most
                           send one token a delta, and `stats.tokens` counts deltas until the
                           server's usage gives its own count)
    Finished(reason, text, stats)   "eos" (finish_reason stop), "max_tokens" (length) or
                           "stopped" (Esc); text is the whole reply (continue: the old part too)
  StepStats are the client's view: ttft_ms from the request to the first text, tok_per_s over
  the deltas after it, step "remote", window 0, position the server's usage (prompt + reply
  tokens) where it reports it, max_len 0 (a server's context is its own).
- A reply that fails before the server accepted it (refused, DNS, TLS, 401/403, 404, 429, 5xx,
  a timeout) changes nothing and raises ValueError (the app gives the message back to the
  input). One that fails after (the stream cut, malformed SSE, a timeout mid-reply) keeps what
  came as the reply, marked stopped, then raises ValueError: the app keeps and marks it too.
- `stop()` (any thread) ends the reply at once: the connection is shut down under the stream
  thread, so the server sees the client go (llama-server then stops decoding) and a server that
  answers nothing never holds the app. A stop before the server accepted takes the turn back, as a
  failure does. `close()` stops and closes the connection pool.
- continue_reply sends the conversation with the reply as its last, assistant, message.
  llama-server continues such a message (its default; `--no-prefill-assistant` turns that off),
  and Ollama does too; vLLM and SGLang continue one only when asked with their own
  `continue_final_message` field, which this client does not send (OpenAI's API refuses fields
  it does not know): there a continue writes a new reply after the old one.
- Of /set's values, `sent_params` go with each request (seed as a non-negative 31-bit number,
  which every server takes); the rest (top_k, the repetition penalty, DRY, repeat_stop) are kept
  but not sent: each server has its own.
- Ctrl+G and thinking do not apply: set_graphs and set_thinking raise ValueError saying so.
`open_session(local, servers, first, progress, **changes)` is the app's opener: a ServerSession
for a server spec (the first one already resolved by __main__), else chat_app.remote_session's
RemoteSession for a local model.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import httpx

from chat_app.remote_session import RemoteSession
from chat_app.server_api import Endpoint, ServerError, chunks, client, endpoint, is_server, list_models, open_stream
from tinyllm.decode.sampling_params import SamplingParams
from tinyllm.session.chat_events import Finished, Message, Prefilled, StepStats, Token
from tinyllm.session.session_protocol import Capabilities, Event

REASONS = {"stop": "eos", "length": "max_tokens"}  # finish_reason -> Finished.reason (others: "eos")
KEPT = "; the reply so far is kept"


def open_session(local: dict[str, Any], servers: Mapping[str, Any], first: Endpoint | None,
                 progress: Callable[..., None] | None = None, **changes: Any) -> Any:
    """A ServerSession where the model is a server, else a RemoteSession (a local model)."""
    path = changes.get("path")
    if path is None and first is not None:
        return ServerSession(first, local["params"], local.get("system"))
    if path is not None and is_server(str(path), servers):
        return ServerSession(endpoint(str(path), servers), local["params"], changes.get("system", local.get("system")))
    return RemoteSession(local, progress, **changes)


class ServerSession:
    graphs_available = False
    use_graph = False
    step_kind = "remote"
    compile_error = ""
    thinking = None
    context_note = ""
    log_error = ""
    ended = ""  # a server session has no process to end: a fault is one reply's
    family = ""
    dtype = "remote"
    weights = ""
    first_message = 0
    max_len = model_max_len = 0  # unknown: the server's own
    sent_params = ("temperature", "top_p", "max_tokens", "seed")
    capabilities = Capabilities(served=True, graphs=False, context=0)  # the server's context: unknown here

    def __init__(self, ep: Endpoint, params: SamplingParams, system: str | None = None) -> None:
        self._http = client(ep)
        try:
            self.models = list_models(self._http, ep)
        except ValueError:
            self._http.close()
            raise
        model = ep.model or (self.models[0] if self.models else None)
        if model is None:
            self._http.close()
            raise ValueError(f"{ep.host} lists no models; name one: {ep.url}#MODEL")
        if self.models and model not in self.models and f"{model}:latest" not in self.models:
            self._http.close()
            raise ValueError(f"{ep.host} serves no model {model!r}; it serves {', '.join(self.models[:8])}"
                             f"{' …' if len(self.models) > 8 else ''} (pick one: {ep.url}#MODEL)")
        self.endpoint = replace(ep, model=model)
        self.name = f"{model} ({ep.host})"
        self.path = self.endpoint.spec  # what reopens it: saved as the chat's model_spec
        self.device = ep.host
        self.params, self.system = params, system or None
        self.messages: list[Message] = []
        self.last_stats: StepStats | None = None
        self.timeline: dict[str, float] = {}
        self._position = 0  # the server's count of the conversation's tokens, as last reported
        self._lock = threading.Lock()  # the reply in flight's queue, stop flag and response
        self._items: queue.SimpleQueue | None = None
        self._stopped = threading.Event()
        self._response: httpx.Response | None = None
        self._closed = False

    @property
    def context(self) -> range:
        return range(self._position)

    # ---- the Session's replies ---------------------------------------------------------------

    def send(self, text: str) -> Iterator[Event]:
        return self._reply([*self.messages, Message("user", text)])

    def edit(self, text: str) -> Iterator[Event]:
        """The last user turn and its reply replaced by `text`, and its reply."""
        last = max((i for i, m in enumerate(self.messages) if m.role == "user"), default=None)
        if last is None:
            raise ValueError("no message to edit")
        return self._reply([*self.messages[:last], Message("user", text)])

    def regenerate(self, params: SamplingParams | None = None) -> Iterator[Event]:
        turns = self.messages[:-1] if self.messages and self.messages[-1].role == "assistant" else list(self.messages)
        if not turns or turns[-1].role != "user":
            raise ValueError("no message to reply to")
        return self._reply(turns, params)

    def continue_reply(self) -> Iterator[Event]:
        if not self.messages or self.messages[-1].role != "assistant":
            raise ValueError("no reply to continue")
        last = self.messages[-1]
        return self._reply([*self.messages[:-1], Message("assistant", last.content)], continuing=True)

    def _reply(self, turns: list[Message], params: SamplingParams | None = None,
               continuing: bool = False) -> Iterator[Event]:
        """Stream the reply to `turns` (the conversation as it is to be). The session's messages
        become `turns` and the reply only once the server has accepted the request."""
        if self._closed:
            raise ValueError("the session is closed")
        reply = turns[-1] if continuing else Message("assistant", "")
        body = self._body(turns, params or self.params)
        items: queue.SimpleQueue = queue.SimpleQueue()
        stopped = threading.Event()
        with self._lock:
            self._items, self._stopped = items, stopped
        threading.Thread(target=self._read, args=(body, items, stopped), daemon=True,
                         name="tinyllm-server-stream").start()
        return self._events(turns, reply, continuing, items, time.monotonic())

    def _events(self, turns: list[Message], reply: Message, continuing: bool, items: queue.SimpleQueue,
                sent: float) -> Iterator[Event]:
        accepted, first, last, n, usage, reason = False, 0.0, 0.0, 0, None, "eos"
        while True:
            kind, value = items.get()
            if kind == "stop":
                if not accepted:
                    raise ValueError("stopped before the server answered")
                reason = "stopped"
                break
            if kind == "error":
                if accepted:
                    reply.stopped = True
                    message = str(value)
                    raise ValueError(message if message.endswith(KEPT) else message + KEPT)
                raise value
            if kind == "accepted":
                accepted = True
                self.messages = turns if continuing else [*turns, reply]
                yield Prefilled(n_tokens=0, ms=(time.monotonic() - sent) * 1000)
                continue
            if kind == "end":
                reason = REASONS.get(value, "eos")
                break
            usage = value.usage or usage
            if value.text:
                last = time.monotonic()
                first = first or last
                n += 1
                reply.content += value.text
                yield Token(value.text, self._stats(n, sent, first, last, None))
        reply.stopped = reason == "stopped"
        if usage and isinstance(usage.get("total_tokens"), int):
            self._position = usage["total_tokens"]
        self.last_stats = self._stats(n, sent, first, last, usage)
        yield Finished(reason, reply.content, self.last_stats)

    def _stats(self, n: int, sent: float, first: float, now: float, usage: dict | None) -> StepStats:
        tokens = usage["completion_tokens"] if usage and isinstance(usage.get("completion_tokens"), int) else n
        speed = (n - 1) / (now - first) if n > 1 and now > first else 0.0  # deltas after the first, as seen here
        return StepStats(window=0, position=self._position + n, max_len=self.max_len, tokens=tokens,
                         tok_per_s=speed, ttft_ms=(first - sent) * 1000 if first else 0.0, graphs=None, step="remote")

    def _body(self, turns: list[Message], params: SamplingParams) -> dict[str, Any]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        body: dict[str, Any] = {
            "model": self.endpoint.model, "stream": True, "stream_options": {"include_usage": True},
            "messages": system + [{"role": m.role, "content": m.content} for m in turns],
            "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.seed is not None:
            body["seed"] = params.seed % 2**31
        return body

    def _read(self, body: dict[str, Any], items: queue.SimpleQueue, stopped: threading.Event) -> None:
        """The stream thread: the server's answer into `items`, as ("accepted" | "chunk" | "end" |
        "error", value); it ends at the stream's end, a fault, or `stopped`."""
        response: httpx.Response | None = None

        def opened(r: httpx.Response) -> None:
            nonlocal response
            response = r
            with self._lock:
                self._response = r
            if stopped.is_set():
                _hang_up(r)

        reason = None
        try:
            response = open_stream(self._http, self.endpoint, body, stopped, opened)
            items.put(("accepted", None))
            for chunk in chunks(response, self.endpoint):
                if stopped.is_set():
                    return
                reason = chunk.finish_reason or reason
                items.put(("chunk", chunk))
            items.put(("end", reason))
        except ServerError as e:
            items.put(("error", e))
        except Exception as e:  # closed under it by stop(), or what the client library did not expect
            items.put(("error", ServerError(f"the stream from {self.endpoint.host} failed ({type(e).__name__})")))
        finally:
            if response is not None:
                _close(response)  # here, on the thread that reads it

    def stop(self) -> None:
        """End the reply in flight now (any thread); its stream closes in the background."""
        with self._lock:
            items, response = self._items, self._response
            self._stopped.set()
        if items is not None:
            items.put(("stop", None))
        if response is not None:
            _hang_up(response)

    def close(self) -> None:
        self._closed = True
        self.stop()
        threading.Thread(target=_close, args=(self._http,), daemon=True, name="tinyllm-server-close").start()

    # ---- the rest of the Session -------------------------------------------------------------

    def new_chat(self) -> None:
        self.messages, self._position = [], 0

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        """A saved chat: (role, content) pairs; a user turn after a user turn gets an empty
        stopped reply between them, as a local session's (turns alternate)."""
        self.messages, self._position = [], 0
        for role, content in messages:
            if role == "system":
                self.system = content or None
                continue
            if role == "user" and self.messages and self.messages[-1].role == "user":
                self.messages.append(Message("assistant", "", stopped=True))
            self.messages.append(Message(role, content))

    def set_param(self, name: str, value: str) -> None:
        self.params = self.params.with_value(name, value)

    def set_graphs(self, on: bool) -> None:
        raise ValueError("Ctrl+G does not apply: the server decodes, with its own settings")

    def set_thinking(self, on: bool) -> None:
        raise ValueError("/set thinking does not apply to a server's model")

    def wait_compiled(self, timeout: float | None = None) -> bool:
        return True

    def restart(self, messages: list[tuple[str, str]], progress: Callable[..., None] | None = None) -> None:
        self.load_messages(messages)  # never called: `ended` stays ""


def _hang_up(response: httpx.Response) -> None:
    """End a response's connection from another thread: shutdown(), which sends the server a FIN
    and wakes the stream thread's blocked read at once, never blocks, and leaves the close to
    that thread. (A close() from here did neither: on Linux it frees the descriptor under the
    blocked read, and the next request's socket took its number, so that read stole the next
    reply, and llama-server, still writing the old one, never saw the client go.)"""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already


def _close(thing: httpx.Response | httpx.Client) -> None:
    try:
        thing.close()
    except Exception:
        pass  # closed under a read, or twice: nothing more to do
