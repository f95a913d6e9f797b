"""Items 6 and 7 of issue 13: the load's progress bar, and switching models with /model."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from chat_app.widgets.load_progress import LoadProgress
from chat_app.widgets.reply import Reply
from chat_app.widgets.status_bar import StatusBar
from tests.chat_app.conftest import loaded, notes, send, wait_until
from tinyllm.formats.model_files import read_safetensors_header, weight_files
from tinyllm.tools.testing import make_tiny_checkpoint

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


@pytest.fixture(scope="module")
def other_ckpt(tmp_path_factory):
    """A second model, with its own name and weights."""
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("other") / "other", seed=1)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "name": "other-tiny"}))
    return path


@pytest.fixture(scope="module")
def corrupt_ckpt(other_ckpt, tmp_path_factory):
    """Passes the quick checks (files, headers) but not the loader's: a junk tokenizer."""
    path = tmp_path_factory.mktemp("corrupt") / "corrupt"
    path.mkdir()
    for f in other_ckpt.iterdir():
        (path / f.name).write_bytes(b"junk" if f.name == "tokenizer.model" else f.read_bytes())
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def model_command(pilot, path) -> None:
    pilot.app.prompt.load_text(f"/model {path}")
    await pilot.press("enter")


async def test_the_load_shows_its_progress_up_to_the_last_tensor(make_app, ckpt, monkeypatch):
    seen: list[tuple[int, int]] = []
    advance = LoadProgress.advance

    def record(self, done: int, total: int) -> None:
        seen.append((done, total))
        advance(self, done, total)

    monkeypatch.setattr(LoadProgress, "advance", record)
    n = sum(len(read_safetensors_header(f)) for f in weight_files(ckpt, ""))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        bar = app.load_progress.bar
        assert seen[0] == (0, n) and seen[-1] == (n, n) and n > 10
        assert all(a[0] < b[0] for a, b in zip(seen, seen[1:], strict=False))  # only forward
        assert bar.total == n and bar.progress == n and bar.percentage == 1
        assert not app.load_progress.display  # hidden once loaded
        assert "ready" in app.query_one(StatusBar).line


async def test_switching_models_starts_a_new_chat_and_ends_the_old_process(make_app, ckpt, other_ckpt, data_dir):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        old = app.session
        assert old.name == "tiny-test" and alive(old.pid)
        await model_command(pilot, other_ckpt)
        await wait_until(pilot, lambda: app.session is not None and app.session is not old, what="the new model")
        await wait_until(pilot, lambda: not alive(old.pid), what="the old model's process to end")
        new = app.session
        assert new.name == "other-tiny" and new.path == str(other_ckpt.resolve()) and alive(new.pid)
        assert not app.query(Reply)  # a new chat
        assert "other-tiny" in app.status.line and app.sub_title == "other-tiny"
        assert app.load_progress.bar.progress == app.load_progress.bar.total
        await send(pilot, "Hi there")
        reply = app.query_one(Reply)
        assert reply.border_title == "other-tiny" and new.last_stats.tokens > 0 and reply.text
        await model_command(pilot, "")
        answer = notes(app)[-1].split("\n")  # a command's answer: the model open, then every one known
        assert answer[0].startswith(f"Model: other-tiny ({other_ckpt.resolve()})")
        assert f"* other-tiny: {other_ckpt.resolve()}" in answer  # open: marked
        assert f"  tiny-test: {ckpt.resolve()}" in answer  # the first chat's model (as Tab offers it)
        assert any(line.startswith("  tinychat: ") for line in answer)  # the models folder's
    with sqlite3.connect(data_dir / "chat.db") as db:  # both chats saved, each reply with its model
        chats = db.execute("SELECT c.model, m.model FROM messages m JOIN conversations c "
                           "ON m.conversation = c.id WHERE m.role = 'assistant' ORDER BY m.id").fetchall()
    assert chats == [("tiny-test", "tiny-test"), ("other-tiny", "other-tiny")]


@pytest.mark.parametrize("bad", ["missing", "corrupt"])
async def test_a_bad_model_keeps_the_old_one_answering(make_app, corrupt_ckpt, tmp_path, bad):
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        old = app.session
        await model_command(pilot, tmp_path / "nope" if bad == "missing" else corrupt_ckpt)
        want = "does not exist" if bad == "missing" else "could not open"
        await wait_until(pilot, lambda: any(want in n for n in notes(app)), what="the error, /model's answer")
        await wait_until(pilot, lambda: app.session is old, what="the old model back")
        assert [n for n in notes(app) if want in n][0].count("\n") == 0
        assert alive(old.pid) and "ready" in app.status.line and "tiny-test" in app.status.line
        await send(pilot, "Still there?")
        assert len(app.query(Reply)) == 2 and len(old.messages) == 4  # the same chat goes on


async def test_a_model_by_name_from_the_hub(make_app, endpoint):
    """`/model hf:OWNER/REPO`: downloaded on the worker from the stand-in Hub (tests/hub_server.py),
    then opened as /model PATH does; a repo the Hub lacks is one notice and the old model stays."""
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        old = app.session
        await model_command(pilot, "hf:me/nothere")
        await wait_until(pilot, lambda: any("the Hub has no model me/nothere" in n for n in notes(app)),
                         what="the Hub's refusal")
        await wait_until(pilot, lambda: app.session is old, what="the old model back")
        await model_command(pilot, "hf:me/one")
        await wait_until(pilot, lambda: app.session is not None and app.session is not old, what="the Hub's model")
        assert app.session.path.endswith("m.Q8_0.gguf") and endpoint.requests > 0
        await send(pilot, "Hi there")
        assert app.session.last_stats.tokens > 0
        # one name everywhere (issue 34, item 9): the file's, not the GGUF's general.name
        assert app.session.name == "m.Q8_0" and app.query_one(Reply).border_title == "m.Q8_0"
        assert "m.Q8_0" in app.status.line and app.sub_title == "m.Q8_0"
