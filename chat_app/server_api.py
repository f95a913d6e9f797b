"""The HTTP side of an OpenAI-compatible server (vLLM, SGLang, llama.cpp's llama-server, Ollama):
which --model values are servers, the model list, one streamed chat completion, and every
fault as one line.

Contract:
- A server spec is `http(s)://HOST[:PORT][/PATH]` (PATH defaults to /v1) or a `[servers]`
  NAME from config.toml, either followed by `#MODEL` to pick one of its models.
  `is_server(spec, servers)` says whether a --model / /model value is one (no network);
  `endpoint(spec, servers, key)` resolves it to an `Endpoint` (base URL, model or None, its
  key by chat_app.api_keys' rule, timeouts) or raises ValueError in one line.
- `list_models(client, ep)` is `GET {url}/models`: the ids, in the server's order.
- `open_stream(client, ep, body, stopped)` POSTs `{url}/chat/completions` with stream on and
  returns the open response once the server accepted it (200 and an event stream). A 429 or
  5xx that names a Retry-After of at most RETRY_AFTER_MAX_S seconds is tried again, at most
  RETRIES times, the wait cut short by `stopped`. `chunks(response, ep)` then yields each
  event's `Chunk` (its text, finish_reason, usage) until `[DONE]`, parsed by httpx-sse (the
  maintained SSE parser; httpx + httpx-sse rather than the openai package, which pulls
  pydantic and more for the one call this needs).
- Every failure is a `ServerError` (a ValueError) whose message is one line naming the server:
  connection refused, DNS, TLS, timeouts (connect CONNECT_S; the start-up check's answer
  CONNECT_S too; a reply's READ_S between two bytes, which a `[servers]` table's `timeout`
  changes; each message names the time waited and which of these it was), 401/403, 404, 429,
  5xx (with the server's own message, cut to one line), a stream cut mid-way, malformed SSE. Text from the
  server is untrusted: it reaches the screen only through chat_app.labels like any other.
- The key is sent as `Authorization: Bearer` to this endpoint only; it never appears in a
  message, a repr or the log.
Imports no torch and no textual.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from httpx_sse import EventSource, SSEError

from chat_app.api_keys import Secret, resolve

CONNECT_S = 10.0  # a server that does not accept a connection, or answer GET /models at start-up, in this long is not there
READ_S = 120.0  # the longest silence between two bytes (a long prompt's prefill on a slow server)
RETRIES = 2  # 429 / 5xx tried again at most this often, where the server asks (Retry-After)
RETRY_AFTER_MAX_S = 10.0  # ... and only when it asks for this long at most
MESSAGE_CHARS = 160  # the server's own error message, cut to this


class ServerError(ValueError):
    """A server fault, as one line for the user."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # the API's base: "http://127.0.0.1:8080/v1", no trailing slash
    model: str | None = None  # None: the server's first
    key: Secret | None = None  # sent only here (chat_app.api_keys)
    name: str = ""  # its [servers] name ("" for a URL)
    read_s: float = READ_S  # a reply's read timeout: its [servers] table's `timeout` (not the start-up check's)

    @property
    def host(self) -> str:
        """host:port, as the status bar and the notes name the server."""
        return urlsplit(self.url).netloc

    @property
    def spec(self) -> str:
        """What reopens it (a saved chat's model_spec): the URL and the model, never the key."""
        return f"{self.url}#{self.model}" if self.model else self.url


@dataclass
class Chunk:
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


def _is_url(spec: str) -> bool:
    return spec.lower().startswith(("http://", "https://"))


def is_server(spec: str | None, servers: Mapping[str, Any]) -> bool:
    if not spec:
        return False
    return _is_url(spec) or spec.partition("#")[0] in servers


def base_url(url: str) -> str:
    """The URL as kept and compared: no trailing slash, /v1 where it names no path.
    ValueError for one that is not http(s)://HOST or that carries a user or password."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a server URL; give http://HOST:PORT/v1 or https://...")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a server URL may not carry a user or key (it would be saved with the chat); "
                         "give the key through TINYLLM_CHAT_API_KEY or a [servers] table (docs/USING.md)")
    try:
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise ValueError(f"{url!r} has a bad port") from None
    path = parts.path.rstrip("/") or "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def endpoint(spec: str, servers: Mapping[str, Mapping[str, Any]], key: Secret | None = None) -> Endpoint:
    """The endpoint a spec names. `key` (TINYLLM_CHAT_API_KEY, for this run's first server only)
    is used where no [servers] table gives one."""
    where, _, model = spec.partition("#")
    table = servers.get(where)
    url = base_url(table["url"] if table is not None else where)
    if table is None:  # a URL: its table, where one has this very URL
        table = next((t for t in servers.values() if base_url(t["url"]) == url), None)
    name = next((n for n, t in servers.items() if t is table), "") if table is not None else ""
    if table is not None and table.get("api_key"):
        key = resolve(table["api_key"], name)
    return Endpoint(url=url, model=model or (table or {}).get("model") or None, key=key, name=name,
                    read_s=float((table or {}).get("timeout", READ_S)))


def client(ep: Endpoint) -> httpx.Client:
    """One connection pool for the session (its key in its headers, for its URL only)."""
    headers = {"Authorization": f"Bearer {ep.key.reveal()}"} if ep.key is not None else {}
    timeout = httpx.Timeout(connect=CONNECT_S, read=ep.read_s, write=ep.read_s, pool=CONNECT_S)
    # verify: the machine's own trusted certificates (OpenSSL's defaults, which SSL_CERT_FILE and
    # SSL_CERT_DIR set), not only certifi's bundle: a server with a company CA the machine trusts.
    return httpx.Client(headers=headers, timeout=timeout, follow_redirects=False, trust_env=False,
                        verify=ssl.create_default_context())


def list_models(http: httpx.Client, ep: Endpoint) -> list[str]:
    try:
        response = http.get(f"{ep.url}/models", timeout=CONNECT_S)  # before the window opens: not a reply's wait
    except httpx.HTTPError as e:
        raise ServerError(describe(e, ep, startup=True)) from None
    if response.status_code != 200:
        raise ServerError(status_message(response.status_code, response.content, ep, response.headers))
    try:
        return [str(m["id"]) for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ServerError(f"{ep.host} answered GET /models with something that is not a model list; "
                          "is it an OpenAI-compatible server (its URL ends in /v1)?") from None


def open_stream(http: httpx.Client, ep: Endpoint, body: dict[str, Any], stopped: threading.Event,
                opened: Callable[[httpx.Response], None]) -> httpx.Response:
    """The accepted stream (see the module's contract). `opened(response)` hears of each
    response as it opens, so that another thread may close it."""
    for attempt in range(RETRIES + 1):
        try:
            response = http.send(http.build_request("POST", f"{ep.url}/chat/completions", json=body,
                                                    headers={"Accept": "text/event-stream"}), stream=True)
        except httpx.HTTPError as e:
            raise ServerError(describe(e, ep)) from None
        opened(response)
        if response.status_code == 200:
            kind = response.headers.get("content-type", "").partition(";")[0].strip()
            if kind != "text/event-stream":
                response.close()
                raise ServerError(f"{ep.host} answered with {kind or 'no content type'}, not an event stream")
            return response
        try:
            content = response.read()
        except httpx.HTTPError:
            content = b""
        response.close()
        wait = retry_after(response.headers)
        if (response.status_code == 429 or response.status_code >= 500) and wait is not None and attempt < RETRIES:
            if stopped.wait(wait):
                break
            continue
        raise ServerError(status_message(response.status_code, content, ep, response.headers))
    raise ServerError("stopped before the server answered")


def chunks(response: httpx.Response, ep: Endpoint) -> Iterator[Chunk]:
    """The stream's events until [DONE]; ServerError for one that is not a chat chunk, or for
    a stream that ends without [DONE] or a finish_reason (cut mid-reply)."""
    finished = False
    try:
        for event in EventSource(response).iter_sse():
            if event.data.strip() == "[DONE]":
                return
            if not event.data.strip():
                continue
            try:
                data = json.loads(event.data)
            except ValueError:
                raise ServerError(f"{ep.host} sent a malformed stream (an event that is not JSON)") from None
            if not isinstance(data, dict):
                raise ServerError(f"{ep.host} sent a malformed stream (an event that is not a chat chunk)")
            if "error" in data:
                raise ServerError(f"{ep.host} failed mid-reply: {error_text(data)}")
            chunk = _chunk(data, ep)
            finished = finished or chunk.finish_reason is not None
            yield chunk
    except (httpx.HTTPError, SSEError) as e:
        raise ServerError(describe(e, ep, mid_reply=True)) from None
    if not finished:
        raise ServerError(f"{ep.host} ended the stream mid-reply (no [DONE])")


def _chunk(data: dict[str, Any], ep: Endpoint) -> Chunk:
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise ServerError(f"{ep.host} sent a malformed stream (a chunk without choices)")
    if not choices:  # the usage chunk (stream_options.include_usage)
        return Chunk("", None, usage)
    choice = choices[0]
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        raise ServerError(f"{ep.host} sent a malformed stream (a choice without a delta)")
    text = delta.get("content") or ""
    if not isinstance(text, str):
        raise ServerError(f"{ep.host} sent a malformed stream (content that is not text)")
    reason = choice.get("finish_reason")
    return Chunk(text, reason if isinstance(reason, str) else None, usage)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a Retry-After header asks for, in seconds, where it is one we wait for."""
    try:
        wait = float(headers.get("retry-after", ""))
    except ValueError:
        return None
    return wait if 0 <= wait <= RETRY_AFTER_MAX_S else None


def error_text(data: Any) -> str:
    """The server's own message in an error body (OpenAI's, llama-server's, vLLM's, Ollama's,
    FastAPI's shapes), one line, cut to MESSAGE_CHARS; "" when there is none."""
    found: Any = ""
    if isinstance(data, dict):
        error = data.get("error")
        found = (error.get("message") if isinstance(error, dict) else error) or data.get("message") or data.get("detail")
    text = " ".join(str(found or "").split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


def status_message(status: int, content: bytes, ep: Endpoint, headers: Mapping[str, str]) -> str:
    try:
        said = error_text(json.loads(content))
    except ValueError:
        said = ""
    if ep.key is not None and ep.key.reveal():  # a server or proxy that echoes the token back: never shown
        said = said.replace(ep.key.reveal(), "***")
    said = f": {said}" if said else ""
    if status in (401, 403):
        how = ("give the right key: TINYLLM_CHAT_API_KEY or a [servers] table's api_key (docs/USING.md)"
               if ep.key is not None else "it wants an API key: TINYLLM_CHAT_API_KEY or a [servers] table's "
               "api_key (docs/USING.md)")
        return f"{ep.host} refused the request ({status}{said}); {how}"
    if status == 404:
        if ep.model is None:  # the model list itself: the URL's path is not an OpenAI API's
            return f"{ep.host} has no {urlsplit(ep.url).path or '/'}/models (404{said}); is the URL's path /v1?"
        return f"{ep.host} does not know model {ep.model!r} or this path (404{said}); /model lists its models"
    if status == 429:
        wait = headers.get("retry-after")
        return f"{ep.host} is busy (429{said}); try again" + (f" after {wait} s" if wait else " later")
    if status >= 500:
        return f"{ep.host} failed ({status}{said}); try again, or see the server's log"
    return f"{ep.host} refused the request ({status}{said})"


def describe(error: BaseException, ep: Endpoint, mid_reply: bool = False, startup: bool = False) -> str:
    """A transport failure in one line: what happened, to which server. A timeout names the
    time it waited and which limit that was: `startup` is the model-list check (CONNECT_S for
    everything), else a reply (CONNECT_S to connect, the endpoint's read_s for the rest)."""
    causes = []
    seen: BaseException | None = error
    while seen is not None and len(causes) < 10:
        causes.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(c) for c in causes)
    if isinstance(error, httpx.ConnectTimeout):
        return f"{ep.host} did not accept a connection within {CONNECT_S:g} s (the connect timeout, fixed)"
    if isinstance(error, httpx.TimeoutException) and startup:
        return (f"{ep.host} accepted the connection but answered nothing in {CONNECT_S:g} s at start-up "
                "(GET /models; the start-up check's fixed limit: a [servers] table's timeout is a reply's)")
    if isinstance(error, httpx.PoolTimeout):
        return f"no connection to {ep.host} came free within {CONNECT_S:g} s (the connect timeout, fixed)"
    if isinstance(error, httpx.ReadTimeout | httpx.WriteTimeout):
        setting = f"[servers.{ep.name}] timeout" if ep.name else "a [servers] table's timeout"
        what = "sent nothing for" if isinstance(error, httpx.ReadTimeout) else "took none of the request for"
        return (f"{ep.host} {what} {ep.read_s:g} s (a reply's read timeout; {setting} changes it)"
                + ("; the reply so far is kept" if mid_reply else ""))
    if any(isinstance(c, socket.gaierror) for c in causes) or "Name or service not known" in text \
            or "name resolution" in text or "nodename nor servname" in text:
        return f"cannot find the server {urlsplit(ep.url).hostname} (DNS: no such host)"
    if any(isinstance(c, ssl.SSLError) for c in causes) or "SSL" in text or "TLS" in text:
        why = next((str(c) for c in causes if isinstance(c, ssl.SSLError)), "")
        return f"TLS failed with {ep.host}" + (f" ({' '.join(why.split())[:MESSAGE_CHARS]})" if why else "") + \
            "; is it https, with a certificate this machine trusts?"
    if any(isinstance(c, ConnectionRefusedError) for c in causes) or "refused" in text.lower():
        return f"{ep.host} refused the connection (is the server running?)"
    if isinstance(error, SSEError):
        return f"{ep.host} sent a malformed stream ({' '.join(str(error).split())[:MESSAGE_CHARS]})"
    if mid_reply:
        return f"the connection to {ep.host} broke mid-reply; the reply so far is kept"
    return f"could not reach {ep.host} ({type(error).__name__})"
