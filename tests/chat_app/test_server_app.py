"""The app chatting with an OpenAI-compatible server, driven by Pilot: against the stand-in
server (tests/chat_app/openai_stub.py), which shows each fault on cue (a stream cut after two
deltas, a reply held open until Esc, 401 for a wrong key) and records every request's body and
headers. The same app against the real llama-server is tests/chat_app/test_real_server.py.
Every wait is on state (the stand-in's events, the app's), never on time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_app import config
from chat_app.__main__ import build_app, build_parser, main
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notes, notices, rows, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (110, 30)
KEY = "sk-test-7f3a9c1e-never-shown"


def server_app(*argv: str):
    app = build_app(build_parser(config.load()).parse_args([*argv]))
    app.NOTIFICATION_TIMEOUT = 3600
    return app


async def test_a_reply_streams_and_is_saved_with_the_server_and_model(stub, data_dir):
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.session.step_kind == "remote" and "remote" in app.status.line
        await send(pilot, "Hello?")
        assert app.query_one(Reply).text == "Hello from the server."
        assert "remote" in app.status.line and f"127.0.0.1:{stub.port}" in app.status.line
        assert "tok/s" in app.status.line and "TTFT" in app.status.line
        await pilot.press("ctrl+g")
        assert any("does not apply" in n for n in notices(app))
        await pilot.press("f1")  # the help says who serves it, not a context of 0 positions
        assert app.screen.about.startswith(f"Served by {stub.url}") and "0 positions" not in app.screen.about
    saved = saved_chat(data_dir)
    assert [(m.role, m.content, m.model) for m in saved][-1] == (
        "assistant", "Hello from the server.", f"tiny-remote (127.0.0.1:{stub.port})")
    import sqlite3

    with sqlite3.connect(data_dir / "chat.db") as db:
        assert db.execute("SELECT model, model_path, model_spec FROM conversations").fetchall() == [
            (f"tiny-remote (127.0.0.1:{stub.port})", None, f"{stub.url}#tiny-remote")]


async def test_escape_mid_stream_keeps_the_partial_marked_and_closes_the_stream(stub, data_dir):
    stub.script = ["hold"]
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me more", wait=False)
        await wait_until(pilot, lambda: app.query(Reply) and app.query_one(Reply).text == "Hello", what="first text")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.busy, what="the reply to stop")
        await wait_until(pilot, lambda: stub.client_left.is_set(), what="the stream to close")
        assert app.session.messages[-1].stopped and app.query_one(Reply).has_class("-noted")
        await send(pilot, "Next")  # the chat goes on
        assert stub.bodies[-1]["messages"][-3:] == [
            {"role": "user", "content": "Tell me more"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Next"}]
    assert [(r[2], r[3], r[4]) for r in rows(data_dir)][:2] == [("user", "Tell me more", 0), ("assistant", "Hello", 1)]


async def test_a_server_dying_mid_reply_keeps_the_message_and_the_partial(stub, data_dir):
    stub.script = ["cut"]
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Go on")
        said = [n for n in notices(app) if "mid-reply" in n]
        assert said and "\n" not in said[0] and "kept" in said[0]
        assert app.query_one(Reply).text == "Hello from"
    assert [(r[2], r[3], r[4]) for r in rows(data_dir)] == [("user", "Go on", 0), ("assistant", "Hello from", 1)]


async def test_a_wrong_key_is_one_line_and_the_message_comes_back(stub, data_dir, monkeypatch):
    stub.api_key = "sk-the-right-one"
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", KEY)
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Let me in", wait=False)
        await wait_until(pilot, lambda: not app.busy and app.prompt.text == "Let me in"
                         and any("401" in n for n in notices(app)), what="the refusal")  # (the notice may come last)
        said = [n for n in notices(app) if "401" in n]
        assert said and "\n" not in said[0] and "Invalid API Key" in said[0] and KEY not in said[0]
        assert app.prompt.text == "Let me in" and not app.session.messages  # kept, in the input
    assert stub.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"


async def test_set_temperature_reaches_the_request_and_others_say_they_are_not_sent(stub):
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await app.run_command("/set temperature 0.6")
        await app.run_command("/set top_p 0.8")
        await app.run_command("/set max_tokens 33")
        await app.run_command("/set top_k 7")
        assert any("not sent" in n for n in notes(app))
        await send(pilot, "Hi")
        body = stub.bodies[-1]
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.6, 0.8, 33) and "top_k" not in body
        await pilot.press("ctrl+r")  # regenerate: a new sample, the same turns
        await wait_until(pilot, lambda: not app.busy and len(stub.requests) == 2, what="the regenerated reply")
        assert [m["content"] for m in stub.bodies[-1]["messages"]] == ["Hi"]
        await pilot.press("ctrl+f")  # continue: the reply goes as the last message
        await wait_until(pilot, lambda: not app.busy and len(stub.requests) == 3, what="the continued reply")
        assert stub.bodies[-1]["messages"][-1] == {"role": "assistant", "content": "Hello from the server."}
        assert app.session.messages[-1].content == "Hello from the server." * 2


async def test_the_key_never_reaches_the_store_the_log_an_export_or_the_screen(stub, data_dir, tmp_path, monkeypatch):
    stub.api_key = KEY
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", KEY)
    app = server_app("--model", stub.url)
    out = tmp_path / "chat.md"
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Secret?")
        assert app.query_one(Reply).text == "Hello from the server."
        await app.run_command("/show")
        await app.run_command("/model")
        await app.run_command(f"/export {out}")
        await wait_until(pilot, lambda: out.exists(), what="the export")
        assert KEY not in app.export_screenshot()
    assert stub.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
    for file in [out, *data_dir.rglob("*")]:
        if file.is_file():
            assert KEY.encode() not in file.read_bytes(), file


async def test_model_url_switches_and_the_model_list_feeds_completion(stub, data_dir):
    stub.models = ["alpha", "beta"]
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.session.name.startswith("alpha")
        from chat_app.palette import completion_sources

        assert f"{stub.url}#beta" in completion_sources(app).models
        await app.run_command(f"/model {stub.url}#beta")
        await wait_until(pilot, lambda: app.session is not None and app.session.name.startswith("beta"))
        await send(pilot, "Hi beta")
        assert stub.bodies[-1]["model"] == "beta"
        await app.run_command(f"/model {stub.url}#gamma")
        await wait_until(pilot, lambda: app.session is not None and any("serves no model" in n for n in notes(app)))
        assert app.session.name.startswith("beta")  # still chatting with it


async def test_named_servers_and_resume_reconnects(stub, data_dir, tmp_path, monkeypatch):
    folder = Path(os.environ["TINYLLM_CHAT_CONFIG_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(f'[servers.home]\nurl = "{stub.url}"\napi_key = "${{HOME_LLM_KEY}}"\n')
    stub.api_key = "sk-home"
    monkeypatch.setenv("HOME_LLM_KEY", "sk-home")
    app = server_app("--model", "home")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "First")
    app = server_app("--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the chat reloaded")
        await send(pilot, "Second")
    assert [m["content"] for m in stub.bodies[-1]["messages"]] == ["First", "Hello from the server.", "Second"]
    assert stub.requests[-1]["headers"]["Authorization"] == "Bearer sk-home"  # found by its URL


async def test_the_environment_key_goes_to_the_command_lines_server_only(stub, data_dir, monkeypatch):
    """TINYLLM_CHAT_API_KEY is for the server --model names: a chat --resume reopens on a server
    (found in chat.db, not on the command line) gets none (it was sent there, a review found)."""
    app = server_app("--model", stub.url)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "First")
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", KEY)
    app = server_app("--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Second")
    assert [m["content"] for m in stub.bodies[-1]["messages"]][-1] == "Second"
    assert all("Authorization" not in r["headers"] for r in stub.requests)
    app = server_app("--model", stub.url)  # named on the command line: it gets the key
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Third")
    assert stub.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("key", ["sk-a b", "sk-ab\x07", "sk-\u00e9t\u00e9"])
def test_a_key_no_header_can_carry_is_one_line_naming_its_source(stub, capsys, monkeypatch, key):
    monkeypatch.setenv("TINYLLM_CHAT_API_KEY", key)
    with pytest.raises(SystemExit) as e:
        main(["--model", stub.url])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "TINYLLM_CHAT_API_KEY" in err and key not in err


def test_bad_servers_are_one_line_before_the_window_opens(capsys, monkeypatch):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SystemExit) as e:
        main(["--model", f"http://127.0.0.1:{port}/v1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "refused the connection" in err
    folder = Path(os.environ["TINYLLM_CHAT_CONFIG_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text('[servers.work]\nurl = "https://x.example/v1"\napi_key = "sk-literal-123"\n')
    with pytest.raises(SystemExit) as e:
        main(["--model", "work"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "${VAR_NAME}" in err and "sk-literal-123" not in err


def test_a_server_session_imports_no_torch_and_starts_no_process(stub, tmp_path):
    code = ("import sys, multiprocessing, subprocess\n"
            "from chat_app.__main__ import build_app, build_parser\n"
            f"app = build_app(build_parser().parse_args(['--model', {stub.url!r}]))\n"
            "started = []\n"
            "subprocess.Popen.__init__ = lambda *a, **k: started.append(a)\n"
            "s = app.open_session(progress=None)\n"
            "print(''.join(e.text for e in s.send('hi') if hasattr(e, 'text') and type(e).__name__ == 'Token'))\n"
            "assert 'torch' not in sys.modules, 'a server session imported torch'\n"
            "assert not started and not multiprocessing.active_children(), 'a process was started'\n")
    env = {**os.environ, "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "d")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Hello from the server."
