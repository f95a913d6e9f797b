"""ServerSession against the stand-in server (tests/chat_app/openai_stub.py): the events a reply
gives, what goes in a request, and each fault as one line with the conversation kept. The
stand-in, not the real llama-server (tests/chat_app/test_real_server.py), because each of these
faults must happen on cue: a stream cut after two deltas, malformed SSE, 429 with Retry-After,
500, a server that never answers. No test waits on time but the timeout tests, whose subject it is."""

from __future__ import annotations

import socket
import threading

import pytest

from chat_app import server_api
from chat_app.api_keys import Secret
from chat_app.server_api import Endpoint, endpoint
from chat_app.server_session import ServerSession
from tinyllm.decode.sampling_params import SamplingParams
from tinyllm.session.chat_events import Finished, Prefilled, Token


def session(stub, **kw) -> ServerSession:
    return ServerSession(Endpoint(stub.url, **kw), SamplingParams(max_tokens=64), system="Be brief.")


def test_a_reply_streams_as_a_local_one_does(stub):
    s = session(stub)
    assert s.name == f"tiny-remote (127.0.0.1:{stub.port})" and s.path == f"{stub.url}#tiny-remote"
    assert s.models == ["tiny-remote"] and s.step_kind == "remote"
    events = list(s.send("hi"))
    assert isinstance(events[0], Prefilled)
    assert "".join(e.text for e in events if isinstance(e, Token)) == "Hello from the server."
    done = events[-1]
    assert isinstance(done, Finished) and done.reason == "eos" and done.text == "Hello from the server."
    assert done.stats.step == "remote" and done.stats.tokens == 5 and len(s.context) == 25
    assert [(m.role, m.content) for m in s.messages] == [("user", "hi"), ("assistant", "Hello from the server.")]
    body = stub.bodies[-1]
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert body["stream"] is True and body["model"] == "tiny-remote" and body["max_tokens"] == 64


def test_set_values_go_as_request_fields_and_regenerate_edit_continue(stub):
    s = session(stub)
    s.set_param("temperature", "0.7")
    s.set_param("top_p", "0.9")
    s.set_param("top_k", "40")  # kept, not sent
    list(s.send("hi"))
    body = stub.bodies[-1]
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9) and "top_k" not in body
    list(s.regenerate(s.params.regenerating(2**62 + 5)))
    assert stub.bodies[-1]["seed"] == (2**62 + 5) % 2**31
    assert [m["role"] for m in stub.bodies[-1]["messages"]] == ["system", "user"]
    list(s.edit("hello"))
    assert [(m.role, m.content) for m in s.messages] == [("user", "hello"), ("assistant", "Hello from the server.")]
    done = list(s.continue_reply())[-1]
    assert stub.bodies[-1]["messages"][-1] == {"role": "assistant", "content": "Hello from the server."}
    assert done.text == "Hello from the server.Hello from the server." and len(s.messages) == 2


def test_a_stream_cut_mid_reply_keeps_the_partial_marked(stub):
    s = session(stub)
    stub.script = ["cut"]
    got = []
    with pytest.raises(ValueError, match="mid-reply.*the reply so far is kept"):
        for event in s.send("hi"):
            got.append(event)
    assert [e.text for e in got if isinstance(e, Token)] == ["Hello", " from"]
    assert s.messages[-1].content == "Hello from" and s.messages[-1].stopped


def test_malformed_sse_is_one_line_and_keeps_the_partial(stub):
    s = session(stub)
    stub.script = ["malformed"]
    with pytest.raises(ValueError, match="malformed stream") as e:
        list(s.send("hi"))
    assert "\n" not in str(e.value) and s.messages[-1].content == "Hello"


@pytest.mark.parametrize("status, said", [
    (401, "refused the request \\(401: bad key\\)"), (403, "403"), (404, "does not know model"),
    (500, "failed \\(500: boom\\)"), (429, "busy \\(429")])
def test_http_faults_before_the_reply_change_nothing(stub, status, said):
    s = session(stub)
    list(s.send("first"))
    stub.script = [(status, {}, {"error": {"message": {401: "bad key", 500: "boom"}.get(status, "no")}})]
    with pytest.raises(ValueError, match=said) as e:
        list(s.send("second"))
    assert "\n" not in str(e.value)
    assert [m.content for m in s.messages] == ["first", "Hello from the server."]


def test_429_and_503_are_tried_again_where_the_server_asks(stub):
    s = session(stub)
    stub.script = [(429, {"Retry-After": "0"}, {"error": "slow down"}), (503, {"Retry-After": "0"}, {})]
    assert list(s.send("hi"))[-1].reason == "eos" and len(stub.requests) == 3
    stub.script = [(429, {"Retry-After": "0"}, {})] * 3  # RETRIES is 2: the third is said
    with pytest.raises(ValueError, match="busy"):
        list(s.send("again"))


def test_a_key_goes_as_a_bearer_header_and_a_wrong_one_is_one_line(stub):
    stub.api_key = "sk-right"
    s = session(stub, key=Secret("sk-wrong"))
    with pytest.raises(ValueError, match="401.*Invalid API Key.*give the right key") as e:
        list(s.send("hi"))
    assert "sk-wrong" not in str(e.value) and "sk-wrong" not in repr(s.endpoint)
    ok = session(stub, key=Secret("sk-right"))
    assert list(ok.send("hi"))[-1].reason == "eos"
    assert stub.requests[-1]["headers"]["Authorization"] == "Bearer sk-right"


def test_a_server_that_never_answers_times_out(stub):
    s = session(stub, read_s=0.3)
    stub.script = ["hang"]
    with pytest.raises(ValueError, match=r"sent nothing for 0.3 s \(a reply's read timeout; a \[servers\] table's"):
        list(s.send("hi"))
    assert s.messages == []
    named = ServerSession(endpoint("slow", {"slow": {"url": stub.url, "timeout": 0.3}}), SamplingParams())
    stub.script = ["hang"]  # the table's timeout is a reply's read timeout, and the message names the table
    with pytest.raises(ValueError) as timed_out:
        list(named.send("hi"))
    assert str(timed_out.value) == f"{named.endpoint.host} sent nothing for 0.3 s (a reply's read timeout; " \
        "[servers.slow] timeout changes it)"


def test_a_server_that_accepts_and_never_answers_says_the_start_up_limit(monkeypatch):
    """A real socket that accepts the connection and reads the request, and never answers: the
    start-up check waits CONNECT_S (made short here), and says so, whatever the table's timeout."""
    monkeypatch.setattr(server_api, "CONNECT_S", 0.2)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted, asked = threading.Event(), threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        accepted.set()
        with conn:
            while data := conn.recv(4096):  # until the client gives up and closes
                if b"GET /v1/models" in data:
                    asked.set()

    server = threading.Thread(target=serve, daemon=True, name="never-answers")
    server.start()
    ep = endpoint("slow", {"slow": {"url": f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "timeout": 300}})
    assert ep.read_s == 300.0
    try:
        with pytest.raises(ValueError) as refused:
            ServerSession(ep, SamplingParams())
        server.join(30)
    finally:
        listener.close()
    assert accepted.is_set() and asked.is_set() and not server.is_alive()
    assert str(refused.value) == (f"{ep.host} accepted the connection but answered nothing in 0.2 s at start-up (GET "
                                  "/models; the start-up check's fixed limit: a [servers] table's timeout is a reply's)")


def test_stop_mid_stream_finishes_stopped_and_closes_the_stream(stub):
    s = session(stub)
    stub.script = ["hold"]
    events = s.send("hi")
    for event in events:
        if isinstance(event, Token):
            break
    stub.held.wait(30)
    s.stop()
    rest = list(events)
    assert rest[-1].reason == "stopped" and rest[-1].text == "Hello"
    assert s.messages[-1].stopped
    assert stub.client_left.wait(30), "the stream was not closed"


def test_stop_before_the_server_answers_takes_the_turn_back(stub):
    s = session(stub)
    stub.script = ["hang"]
    events = s.send("hi")
    s.stop()  # the reply's queue exists from the call: the stop is for it
    with pytest.raises(ValueError, match="stopped before the server answered"):
        list(events)
    assert s.messages == []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_servers_are_one_line():
    with pytest.raises(ValueError, match="refused the connection"):
        ServerSession(Endpoint(f"http://127.0.0.1:{free_port()}/v1"), SamplingParams())
    with pytest.raises(ValueError, match="cannot find the server"):
        ServerSession(Endpoint("http://no-such-host.invalid/v1"), SamplingParams())


def test_tls_to_a_plain_server_is_one_line(stub):
    with pytest.raises(ValueError, match="TLS failed"):
        ServerSession(Endpoint(f"https://127.0.0.1:{stub.port}/v1"), SamplingParams())


def test_unknown_model_is_refused_naming_the_served_ones(stub):
    with pytest.raises(ValueError, match="serves no model 'nope'; it serves tiny-remote"):
        ServerSession(Endpoint(stub.url, model="nope"), SamplingParams())


def test_the_key_rule(monkeypatch):
    servers = {"work": {"url": "https://llm.example/v1", "api_key": "${WORK_KEY}"}, "open": {"url": "http://h:1/v1"}}
    monkeypatch.setenv("WORK_KEY", "sk-work")
    assert endpoint("work", servers).key == Secret("sk-work")
    assert endpoint("https://llm.example/v1/#m", servers).key == Secret("sk-work")  # its URL: its key
    assert endpoint("http://other:8080/v1", servers).key is None  # nothing else is read
    assert endpoint("http://other:8080/v1", servers, Secret("sk-env")).key == Secret("sk-env")  # the --model key
    assert endpoint("work", servers, Secret("sk-env")).key == Secret("sk-work")  # a table's own wins
    assert endpoint("open#m", servers).model == "m"
    monkeypatch.delenv("WORK_KEY")
    with pytest.raises(ValueError, match="WORK_KEY, which is not set"):
        endpoint("work", servers)
    with pytest.raises(ValueError, match="may not carry a user or key"):
        endpoint("http://me:sk-x@h:1/v1", servers)
