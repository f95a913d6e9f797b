"""Issue 34, item 3: a first launch says what it waits on. The CPU kernels' build is a loading
step of its own (its text, its files compiled and seconds, a pulsing bar), a build found in
the cache says so, and a message sent while the model loads waits for it instead of being
refused. The model process holds its load at a gate file (tests/chat_app/held_child.py), so
"still loading" holds by construction, not by timing."""

from __future__ import annotations

import shutil

import pytest

from chat_app.model_switch import NOT_SENT, WAITING
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.load_progress import KERNELS_BUILDING, LoadProgress
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notices, rows, send, wait_until
from tests.chat_app.held_child import FAKE_OBJECTS, held_load
from tinyllm.kernels import cpu_qgemv

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


@pytest.fixture
def steps(monkeypatch) -> list[tuple[str, int, int]]:
    """Every kernels step the load widget is shown: (step, done, total)."""
    seen: list[tuple[str, int, int]] = []
    kernels = LoadProgress.kernels

    def record(self, step: str, done: int, total: int, seconds: float, compiling: tuple[str, ...] = ()) -> None:
        seen.append((step, done, total))
        kernels(self, step, done, total, seconds, compiling)

    monkeypatch.setattr(LoadProgress, "kernels", record)
    return seen


def label(app) -> str:
    return str(app.load_progress.label.content)


@pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler: the kernels' build is not tried")
async def test_the_kernels_build_is_a_loading_step_with_its_files_and_seconds(make_app, tmp_path, monkeypatch,
                                                                            steps):
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path / "cache"))  # empty: a first launch
    gate = tmp_path / "gate"
    app = held_load(make_app(), gate, kernels="fake build")
    total = len(cpu_qgemv.SOURCES)
    async with app.run_test(size=SIZE) as pilot:
        progress = app.load_progress
        await wait_until(pilot, lambda: f"{FAKE_OBJECTS}/{total} files" in str(progress.detail.content),
                         what="the build's files compiled")
        assert label(app) == KERNELS_BUILDING == "Building the CPU kernels (first launch only, about 20 s)"
        assert progress.display and progress.detail.display and progress.bar.total is None  # pulsing
        assert " s" in str(progress.detail.content) and app.status.fields["state"] == "loading"
        assert steps[0] == ("kernels", 0, total) and ("kernels", FAKE_OBJECTS, total) in steps
        gate.touch()
        await loaded(pilot)
        assert steps[-1] == ("kernels failed", FAKE_OBJECTS, total)  # the fake compile fails, the model loads
        assert not progress.display


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
async def test_kernels_built_before_are_said_to_be_cached(make_app, tmp_path, steps):
    """available() above built them (or found them built) in this session's cache; the model
    process finds them there, and says so instead of building."""
    gate = tmp_path / "gate"
    app = held_load(make_app(), gate, kernels="real")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(steps), what="the kernels' step")
        assert label(app) == "CPU kernels: cached" and app.session is None
        assert not app.load_progress.detail.display
        gate.touch()
        await loaded(pilot)
    assert steps == [("kernels cached", 0, 0)]


def user_messages(app) -> list[UserMessage]:
    return list(app.query(UserMessage))


async def test_a_message_sent_while_the_model_loads_waits_and_goes_once_loaded(make_app, tmp_path, data_dir):
    """Shown at once, marked waiting; one waits at a time (a second stays in the input, said in a
    notice); sent, unmarked, once the model has loaded, and saved with its reply."""
    gate = tmp_path / "gate"
    app = held_load(make_app("--max-tokens", "5"), gate)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello", wait=False)
        [waiting] = user_messages(app)
        assert waiting.text == "Hello" and waiting.border_subtitle == WAITING and waiting.has_class("-marked")
        assert app.prompt.text == "" and app.session is None and not app.query(Reply)
        assert not any("still loading" in n for n in notices(app))
        await send(pilot, "And this?", wait=False)
        assert app.prompt.text == "And this?" and len(user_messages(app)) == 1
        assert any("already waiting" in n for n in notices(app))
        gate.touch()
        await wait_until(pilot, lambda: app.session is not None and app.status.fields.get("state") != "loading",
                         what="the model loaded")
        assert waiting.border_subtitle != WAITING, app.status.line  # never "ready" beside "waiting for the model"
        await loaded(pilot)
        await wait_until(pilot, lambda: bool(app.query(Reply)) and not app.busy, what="the waiting message's reply")
        assert user_messages(app) == [waiting] and not waiting.border_subtitle and not waiting.has_class("-marked")
        assert [m.content for m in app.session.messages if m.role == "user"] == ["Hello"]
        assert app.prompt.text == "And this?"  # still there, to send now
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.query(Reply)) == 2 and not app.busy, what="the second reply")
    assert [(role, content) for _, _, role, content, *_ in rows(data_dir) if role == "user"] == [
        ("user", "Hello"), ("user", "And this?")]


async def test_a_waiting_message_survives_a_load_that_fails(make_app, tmp_path, data_dir):
    gate = tmp_path / "gate"
    app = held_load(make_app(), gate, fail=True)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello", wait=False)
        assert [r[2:4] for r in rows(data_dir)] == [("user", "Hello")]  # saved as it was sent (issue 52)
        gate.touch()
        await wait_until(pilot, lambda: app.status.fields.get("state") == "failed", what="the load to fail")
        await pilot.pause()
        [shown] = user_messages(app)
        assert shown.border_subtitle == NOT_SENT and app.prompt.text == "Hello"
        assert rows(data_dir) == []  # not sent: out of the saved chat, as it is back in the input
        assert any("out of memory" in n for n in notices(app))
        await send(pilot, "Hello", wait=False)  # no model: refused as before, the text stays
        assert app.prompt.text == "Hello" and len(user_messages(app)) == 1
