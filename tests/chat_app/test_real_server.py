"""The app against a real llama.cpp llama-server (tests/llama_server.py: SmolLM2-135M on a free
port), driven by Pilot: a reply, Esc mid-stream, the server killed mid-reply, a wrong key, an
unknown model. These use the REAL server because they check what the stand-in cannot: that the
app speaks llama-server's actual SSE, usage and error bodies, and that a real process dying
mid-reply (SIGKILL) is a kept, marked partial. The faults a real server cannot produce on cue
(malformed SSE, 429 with Retry-After, 500, a server that never answers, a stream cut after
exactly two deltas) are tests/chat_app/test_server_session.py and test_server_app.py, against the
stand-in (tests/chat_app/openai_stub.py).

The servers run with --ignore-eos, so a reply runs until Esc, the kill, or max_tokens: a test
that acts mid-reply cannot see the reply end first. Every wait is on state. The fixtures (tests/llama_server.py,
through tests/conftest.py) skip the tests, or in CI fail them, without a llama-server binary or
the GGUF."""

from __future__ import annotations

import pytest

from chat_app import config
from chat_app.__main__ import build_app, build_parser, main
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notices, rows, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (110, 30)
ENDLESS = ("--ignore-eos",)  # the server's own default: every reply runs to max_tokens


def app_for(*argv: str):
    app = build_app(build_parser(config.load()).parse_args([*argv]))
    app.NOTIFICATION_TIMEOUT = 3600
    return app


async def test_a_reply_from_llama_server(llama_server, data_dir):
    app = app_for("--model", llama_server.url, "--max-tokens", "12")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Say hello.")
        reply = app.session.messages[-1]
        assert reply.role == "assistant" and reply.content and app.query_one(Reply).text
        stats = app.controller.core.last_stats
        assert stats.step == "remote" and stats.tokens == 12 and stats.tok_per_s > 0 and stats.ttft_ms > 0
        assert "remote" in app.status.line
    assert saved_chat(data_dir)[-1].model == app.session.name


async def streaming(pilot, app) -> None:
    """A long reply asked for, and streaming: its first text is on screen."""
    await loaded(pilot)
    await send(pilot, "Tell me a long story.", wait=False)
    await wait_until(pilot, lambda: app.query(Reply) and app.query_one(Reply).text, what="streamed text")


async def test_escape_mid_stream_with_llama_server(llama_server_factory, data_dir):
    server = llama_server_factory(extra_args=ENDLESS)
    app = app_for("--model", server.url, "--max-tokens", "100000")
    async with app.run_test(size=SIZE) as pilot:
        await streaming(pilot, app)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.busy, what="the reply to stop")
        assert app.session.messages[-1].stopped and app.query_one(Reply).has_class("-noted")
        await app.run_command("/set max_tokens 5")
        await send(pilot, "And now?")  # at once: the stopped stream's connection is gone, not reused
        assert not app.session.messages[-1].stopped and app.session.messages[-1].content
    assert [r[4] for r in rows(data_dir)] == [0, 1, 0, 0]


async def test_llama_server_killed_mid_reply(llama_server_factory, data_dir):
    server = llama_server_factory(extra_args=ENDLESS)
    app = app_for("--model", server.url, "--max-tokens", "100000")
    async with app.run_test(size=SIZE) as pilot:
        await streaming(pilot, app)
        server.kill()
        await wait_until(pilot, lambda: not app.busy, what="the reply to end")
        said = [n for n in notices(app) if "mid-reply" in n]
        assert said and "\n" not in said[0]
        partial = app.session.messages[-1]
        assert partial.stopped and partial.content
    saved = rows(data_dir)
    assert [(r[2], r[3], r[4]) for r in saved][0] == ("user", "Tell me a long story.", 0)
    assert saved[1][2] == "assistant" and saved[1][3] and saved[1][4] == 1


def test_a_wrong_key_with_llama_server(llama_server_factory, capsys, monkeypatch):
    """llama-server with --api-key guards GET /v1/models too: a wrong key is found when the
    server is opened, before the window (one line, exit 2); the right one chats. (The note a
    wrong key gives mid-chat, from a server whose model list is open, is the stand-in's test:
    test_server_app.py::test_a_wrong_key_is_one_line_and_the_message_comes_back.)"""
    server = llama_server_factory(api_key="sk-the-right-one")
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", "sk-a-wrong-one")
    with pytest.raises(SystemExit) as e:
        main(["--model", server.url])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "401" in err and "sk-a-wrong-one" not in err
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", "sk-the-right-one")
    app = app_for("--model", server.url, "--max-tokens", "3")
    events = list(app.open_session(progress=None).send("Hi"))
    assert events[-1].reason == "max_tokens" and events[-1].text


def test_an_unknown_model_on_llama_server_is_one_line(llama_server, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", f"{llama_server.url}#no-such-model"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "serves no model 'no-such-model'" in err
