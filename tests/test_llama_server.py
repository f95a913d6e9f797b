"""The llama-server fixtures (tests/llama_server.py) against the real server: it lists its model,
streams a chat completion as OpenAI's SSE (`data: {chunk}` lines, then `data: [DONE]`), demands
its API key when given one, and `.kill()` mid-stream closes the reader's connection without
[DONE]. SmolLM2-135M on 2 threads: replies are kept to a few tokens."""

import http.client
import json
import signal
import urllib.error
import urllib.request

import pytest

from tests.llama_server import LlamaServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def post(server: LlamaServer, path: str, body: dict, api_key: str | None = None, timeout: float = 60):
    """An open response (the caller reads it); HTTPError for a status >= 400."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), headers=headers)
    return urllib.request.urlopen(req, timeout=timeout)


def sse_data(resp) -> list[str]:
    """The payloads of the stream's `data:` lines, in order, up to and with [DONE]."""
    out = []
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            out.append(line[len("data: "):])
            if out[-1] == "[DONE]":
                break
    return out


def test_models_lists_the_model(llama_server_factory):
    plain = llama_server_factory()
    with urllib.request.urlopen(plain.url + "/models", timeout=10) as resp:
        ids = [m["id"] for m in json.load(resp)["data"]]
    assert ids == [plain.model] and plain.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")  # its path: no alias
    assert plain.url.startswith("http://127.0.0.1:") and plain.url.endswith("/v1") and plain.api_key is None
    named = llama_server_factory(alias="smol")
    assert named.model == "smol" and named.url != plain.url  # two servers, two free ports


def test_streaming_chat_completion(llama_server):
    body = {"model": llama_server.model, "messages": QUESTION, "stream": True, "temperature": 0, "max_tokens": 12}
    with post(llama_server, "/chat/completions", body) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        data = sse_data(resp)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == llama_server.model for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    print(f"\nuser: {QUESTION[0]['content']}\nllama-server (SmolLM2-135M): {text}")
    assert text.strip()
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_api_key_is_demanded(llama_server_factory):
    server = llama_server_factory(api_key="sk-test")
    body = {"model": server.model, "messages": QUESTION, "temperature": 0, "max_tokens": 1}
    for key in (None, "sk-wrong"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(server, "/chat/completions", body, api_key=key)
        assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.url + "/models", timeout=10)
    assert refused.value.code == 401
    with post(server, "/chat/completions", body, api_key="sk-test") as resp:
        assert resp.status == 200 and json.load(resp)["choices"][0]["message"]["role"] == "assistant"


def test_kill_mid_stream_closes_the_connection(llama_server):
    # a reply far longer than the test waits for: ignore_eos keeps it going until killed
    body = {"model": llama_server.model, "messages": QUESTION, "stream": True, "temperature": 0,
            "max_tokens": 1000, "ignore_eos": True}
    with post(llama_server, "/chat/completions", body, timeout=30) as resp:
        assert resp.readline().startswith(b"data: ")
        llama_server.kill()
        assert llama_server.proc.returncode == -signal.SIGKILL
        # the chunked body stops without its last chunk: read() says so (line by line, http.client
        # just ends; httpx raises RemoteProtocolError), and [DONE] never came
        with pytest.raises((http.client.IncompleteRead, ConnectionError)) as cut:
            resp.read()
    assert b"[DONE]" not in getattr(cut.value, "partial", b"")
    with pytest.raises(urllib.error.URLError) as refused:  # and nothing listens there any more
        urllib.request.urlopen(llama_server.url + "/models", timeout=10)
    assert isinstance(refused.value.reason, ConnectionRefusedError)
