"""The compiled step in the app: replies start at once on the plain step while it compiles
in the background, the status bar says which step runs, and the swap changes nothing shown."""

from __future__ import annotations

import asyncio

import pytest

from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, send, wait_until

pytestmark = pytest.mark.anyio


async def test_status_bar_follows_the_background_compile_and_nothing_shown_changes(make_app):
    app = make_app("--max-tokens", "20", "--compile", "inductor")
    async with app.run_test(size=(140, 30)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello there")
        first = app.session.last_stats.step
        assert first in ("compiling", "compiled")  # "compiled" only if the compile beat the reply
        if first == "compiling":
            assert "compiling…" in app.status.line, app.status.line
        shown = [r.text for r in app.query(Reply)]
        assert await asyncio.to_thread(app.session.wait_compiled, 600), "the compile did not end"
        assert app.session.step_kind == "compiled", app.session.compile_error
        await wait_until(pilot, lambda: "· compiled" in app.status.line,
                         what="the status bar to say compiled before the next reply")
        await send(pilot, "And now?")
        await wait_until(pilot, lambda: "· compiled" in app.status.line, what="the status bar to say compiled")
        assert app.session.last_stats.step == "compiled"
        assert [r.text for r in app.query(Reply)][:1] == shown
        assert [m.content for m in app.session.messages][:2] == ["Hello there", shown[0]]


async def test_without_a_cpp_compiler_the_app_says_so_once_and_replies_go_on(make_app, monkeypatch, tmp_path):
    """Inductor's CPU code needs a C++ compiler: with none (CXX names a missing one, and an
    empty compile cache), the app says so once and stays on the plain step."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    app = make_app("--max-tokens", "5", "--compile", "inductor")
    async with app.run_test(size=(140, 30)) as pilot:
        await loaded(pilot)
        assert await asyncio.to_thread(app.session.wait_compiled, 600)
        assert app.session.step_kind == "compile failed"
        await send(pilot, "Hello")
        await send(pilot, "Again")
        said = [n.message for n in app._notifications if "compiled step is not available" in n.message]
        assert len(said) == 1 and "no working C++ compiler" in said[0], said  # why, before any tracing
        assert "plain step" in app.status.line and len(app.session.messages) == 4


async def test_on_a_cpu_the_native_step_runs_from_the_first_reply_and_says_so(make_app):
    """--compile on (the default) on a CPU: the whole step as one C++ call, nothing compiled,
    the status bar says "native", and the replies are the plain step's."""
    from tinyllm.kernels import cpu_qgemv

    if not cpu_qgemv.available():
        pytest.skip("the CPU kernels cannot be built here")
    replies = {}
    for flag in ("off", "on"):
        app = make_app("--max-tokens", "24", "--compile", flag)
        async with app.run_test(size=(140, 30)) as pilot:
            await loaded(pilot)
            await send(pilot, "Hello there")
            await send(pilot, "And now?")
            replies[flag] = [m.content for m in app.session.messages]
            if flag == "on":
                assert app.session.step_kind == "native" and app.session.last_stats.step == "native"
                await wait_until(pilot, lambda app=app: "· native" in app.status.line, what="the status bar to say native")
    assert replies["on"] == replies["off"] and len(replies["on"]) == 4
