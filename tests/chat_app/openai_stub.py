"""A stand-in OpenAI-compatible server for tests: stdlib http.server on a free port, in a thread,
scripted per test.

It serves `GET /v1/models` (its `models`) and `POST /v1/chat/completions` with stream on. Each
chat request takes the next of `script` (then "ok" for the rest); every request is kept in
`requests` (path, headers, JSON body). Where `api_key` is set, a chat request without
`Authorization: Bearer <api_key>` gets 401, as llama-server's --api-key does (GET /v1/models is
open, as there). What a script step may be:
  "ok"          the reply `reply` (a list of text deltas), finish_reason stop, a usage chunk, [DONE]
  "cut"         the first two deltas, then the connection closes: no finish_reason, no [DONE]
  "malformed"   one delta, then an event whose data is not JSON
  "hold"        one delta, then SSE comments (ignored by a client) until `release` is set or the
                client goes away (`client_left` is set then): a reply still streaming for the test
  "hang"        reads the request and answers nothing until the server stops
  (status, headers, body)   that HTTP error, e.g. (429, {"Retry-After": "0"}, {...})
The real llama-server (tests/llama_server.py) is used where it can show a fault on cue; this one
for the faults a real server cannot be made to produce when a test wants them.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PING_S = 0.02  # "hold": a comment this often, to notice the client leaving


class OpenAIStub:
    def __init__(self, models: tuple[str, ...] = ("tiny-remote",), reply: tuple[str, ...] = ("Hello", " from", " the",
                 " server", "."), api_key: str | None = None) -> None:
        self.models, self.reply, self.api_key = list(models), list(reply), api_key
        self.script: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.client_left = threading.Event()
        self.held = threading.Event()  # a "hold" reply has sent its first delta
        self._stopping = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in stub.models]})
                else:
                    self._json(404, {"error": {"message": "not found", "code": 404}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.path != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "not found", "code": 404}})
                    return
                if stub.api_key is not None and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                    self._json(401, {"error": {"message": "Invalid API Key", "type": "authentication_error",
                                               "code": 401}})
                    return
                step = stub.script.pop(0) if stub.script else "ok"
                if isinstance(step, tuple):
                    status, headers, payload = step
                    self._json(status, payload, headers)
                    return
                getattr(self, f"_{step}")(body)

            def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _start(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()

            def _event(self, data: Any) -> None:
                self.wfile.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def _delta(self, text: str, reason: str | None = None) -> None:
                self._event({"object": "chat.completion.chunk", "model": stub.models[0],
                             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]})

            def _ok(self, body: dict) -> None:
                self._start()
                for text in stub.reply:
                    self._delta(text)
                self._delta("", "stop")
                self._event({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": len(stub.reply),
                                                      "total_tokens": 20 + len(stub.reply)}})
                self._event("[DONE]")

            def _cut(self, body: dict) -> None:
                self._start()
                for text in stub.reply[:2]:
                    self._delta(text)

            def _malformed(self, body: dict) -> None:
                self._start()
                self._delta(stub.reply[0])
                self._event("{this is not json")

            def _hold(self, body: dict) -> None:
                self._start()
                self._delta(stub.reply[0])
                stub.held.set()
                try:
                    while not stub.release.wait(PING_S) and not stub._stopping.is_set():
                        self.wfile.write(b": ping\n\n")
                        self.wfile.flush()
                except OSError:
                    stub.client_left.set()
                    return
                for text in stub.reply[1:]:
                    self._delta(text)
                self._delta("", "stop")
                self._event("[DONE]")

            def _hang(self, body: dict) -> None:
                stub._stopping.wait()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="openai-stub")
        self._thread.start()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def close(self) -> None:
        self._stopping.set()
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
