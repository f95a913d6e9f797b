"""Item 1 of issue 13: chats to go back to (the chat list), and replies that keep their model."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from chat_app.__main__ import build_app, build_parser
from chat_app.app import ChatApp
from chat_app.chat_model import NO_PATH, locate
from chat_app.store import Saved, Store
from chat_app.widgets.chat_list import ChatList
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notices, send, wait_until
from tests.chat_app.test_labels import screen_text
from tinyllm.tools.testing import make_tiny_checkpoint

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def seed_chats(data_dir, model: str = "SmolLM2") -> None:
    """Two saved chats written by another model, one with a system prompt set mid-chat."""
    store = Store.open(data_dir, model=model)
    store.add(Saved("user", "Old question"))
    store.add(Saved("assistant", "Old answer", model=model))
    store.new_chat()
    store.add(Saved("user", "Newer question"))
    store.add(Saved("assistant", "Newer answer", model=model))
    store.set_system("Be brief.")
    store.add(Saved("user", "After the system prompt"))
    store.add(Saved("assistant", "Short.", model=model))
    store.close()


async def test_chat_list_opens_renames_and_deletes(make_app, data_dir):
    seed_chats(data_dir)
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "A chat of this run")
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, ChatList)
        table = app.screen.query_one("DataTable")
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[1] for r in rows] == ["A chat of this run", "Newer question", "Old question"]
        assert rows[0][0] == "▶" and rows[1][3] == "SmolLM2" and rows[1][4] == "4"
        await pilot.press("down", "f2")  # rename "Newer question"
        app.screen.query_one("#rename").value = ""
        await pilot.press(*"Trip", "enter")
        assert str(table.get_row_at(1)[1]) == "Trip"
        await pilot.press("enter")  # open it
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatList)
                         and [m.content for m in app.session.messages][:1] == ["Newer question"],
                         what="the chosen chat in the session")
        await wait_until(pilot, lambda: len(app.query(Reply)) == 2)
        assert app.status.fields["tok_s"] is None  # the last reply's speed was another chat's
        assert [w.text for w in app.query(UserMessage)] == ["Newer question", "After the system prompt"]
        assert [r.border_title for r in app.query(Reply)] == ["SmolLM2", "SmolLM2"]  # not relabelled
        assert app.session.system == "Be brief." and "system prompt: Be brief." in str(
            app.query_one(".chat-note").render())
        await send(pilot, "One more")
        assert app.query(Reply).last().border_title == "tiny-test"
        await pilot.press("ctrl+o", "down", "down", "ctrl+d", "n")  # Ctrl+D asks; any key but y keeps it
        assert app.screen.query_one("DataTable").row_count == 3
        await pilot.press("ctrl+d", "y")
        assert app.screen.query_one("DataTable").row_count == 2
        await pilot.press("tab", "home", "d", "y")  # in the list itself, d: the open chat, deleted; a new chat begins
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.session.messages and not app.query(Reply), what="a new chat")
        assert not [n for n in notices(app) if "rror" in n]
    store = Store.open(data_dir)
    assert [c.title for c in store.chats()] == ["A chat of this run"]
    store.close()


async def test_each_reply_keeps_its_model_on_resume_and_in_export(make_app, data_dir, tmp_path):
    seed_chats(data_dir)
    app = make_app("--max-tokens", "5", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 4, what="the resumed chat")
        await send(pilot, "Hello from tinychat")
        out = tmp_path / "chat.md"
        await send(pilot, f"/export {out}")
        await wait_until(pilot, lambda: any("Exported" in n for n in notices(app)), what="the export (a worker writes it)")
    text = out.read_text()
    assert text.count("## SmolLM2") == 2 and text.count("## tiny-test") == 1
    # the system prompt where it was set: after the first answer, before the next question
    assert text.index("Newer answer") < text.index("**System:** Be brief.") < text.index("After the system")


async def test_chat_list_end_picks_the_last_row_and_every_column_fits_at_80x24(make_app, data_dir):
    """Issue 34, item 10: End then Enter opened the first chat (End scrolled sideways); at 80x24
    the model and message-count columns were off the right edge (the title took them)."""
    seed_chats(data_dir)
    store = Store.open(data_dir, model="SmolLM2")
    store.new_chat()
    store.add(Saved("user", "A very long first message " * 6))
    store.close()
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        screen = screen_text(app)
        assert table.virtual_size.width <= table.scrollable_content_region.width  # nothing off the edge
        assert "msgs" in screen and "SmolLM2" in screen and "A very long first messa…  " in screen
        assert "…" in str(table.get_row_at(0)[1])  # the long title gave way
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1 == 2
        await pilot.press("home")
        assert table.cursor_row == 0
        await pilot.press("end", "enter")  # the oldest chat
        await wait_until(pilot, lambda: [m.content for m in app.session.messages][:1] == ["Old question"],
                         what="the last row's chat")


async def test_a_reply_box_does_not_end_with_an_empty_line(make_app, data_dir):
    """Issue 34, item 10: the last paragraph's (list's, code block's) margin left an empty line
    above each reply's bottom border."""
    from tests.chat_app.test_labels import screen_text

    endings = ["One paragraph.\n\nThe last paragraph.", "A list:\n\n- one\n- two", "Code:\n\n```\nx = 1\n```"]
    store = Store.open(data_dir, model="SmolLM2")
    for n, text in enumerate(endings):
        store.add(Saved("user", f"Question {n}"))
        store.add(Saved("assistant", text, model="SmolLM2"))
    store.close()
    app = make_app("--resume")
    async with app.run_test(size=(100, 60)) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.query(Reply)) == 3, what="the resumed chat")
        await pilot.pause()
        screen = screen_text(app).splitlines()
        for reply in app.query(Reply):
            region, last = reply.region, reply.query_one("Markdown").children[-1]
            assert screen[region.bottom - 1][region.x] == "╰"
            assert last.region.bottom == region.bottom - 1, f"an empty last line in {reply.text!r}"  # its last block
            if "```" not in reply.text:  # (a code block's own shaded padding is its last line)
                assert screen[region.bottom - 2][region.x + 1:region.right - 1].strip(), reply.text


async def test_chat_list_filters_as_you_type(make_app, data_dir):
    """Issue 34, item 10: typing in the chat list keeps the chats whose title or text holds it
    (case aside); the keys that move in the list still move in it, Enter opens the pick."""
    seed_chats(data_dir)
    store = Store.open(data_dir, model="SmolLM2")
    store.new_chat()
    store.add(Saved("user", "Plan a trip"))
    store.add(Saved("assistant", "Pack 100% wool_socks.", model="SmolLM2"))
    store.close()
    app = make_app("--max-tokens", "5")
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        table = app.screen.query_one("DataTable")

        def titles() -> list[str]:
            return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]

        assert titles() == ["Plan a trip", "Newer question", "Old question"]

        async def typed(*keys: str) -> list[str]:  # the filter runs once typing pauses (issue 46, item 7)
            await pilot.press(*keys)
            await wait_until(pilot, lambda: not app.screen.filtering, what="the filter to run")
            return titles()

        assert await typed(*"question") == ["Newer question", "Old question"]  # titles (first messages)
        assert await typed(*["backspace"] * 8, *"ANSWER") == ["Newer question", "Old question"]  # replies, case aside
        assert await typed(*["backspace"] * 6, *"100% wool_") == ["Plan a trip"]  # % and _ are no wildcards
        assert await typed(*["backspace"] * 10, *"brief") == []  # a system prompt is not the chat's text
        assert "No saved chat holds “brief”." in str(app.screen.query_one("#chats-note").render())
        await pilot.press(*["backspace"] * 5, *"old", "end", "enter")
        await wait_until(pilot, lambda: [m.content for m in app.session.messages][:1] == ["Old question"],
                         what="the filtered chat")


def other_model(tmp_path, name: str = "other-tiny"):
    """A second model, with its own name and weights."""
    path = make_tiny_checkpoint(tmp_path / name, seed=1)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "name": name}))
    return path


def app_of(*argv: str, default) -> ChatApp:
    """The app as main() builds it, `default` the model config.toml names (what --resume falls back on)."""
    args = build_parser({"model": str(default)}).parse_args(["--device", "cpu", "--compile", "off",
                                                            "--max-tokens", "5", *argv])
    app = build_app(args)
    app.NOTIFICATION_TIMEOUT = 3600
    return app


async def test_resume_reopens_the_chats_model_or_says_it_is_gone(ckpt, tmp_path):
    """Issue 34, item 4: a chat comes back with the model that wrote it; its model deleted: one
    notice, and the chat goes on with the default model."""
    other = other_model(tmp_path)
    app = app_of("--model", str(other), default=ckpt)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello other")
    app = app_of("--resume", default=ckpt)
    assert app.model_name == "other-tiny"  # decided before the model's process starts
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        assert app.session.name == "other-tiny" and app.session.path == str(other.resolve())
        assert "other-tiny" in app.status.line and not [n for n in notices(app) if "cannot be opened" in n]
        await send(pilot, "Still other?")
        assert [r.border_title for r in app.query(Reply)] == ["other-tiny", "other-tiny"]
    shutil.rmtree(other)
    app = app_of("--resume", default=ckpt)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 4, what="the resumed chat")
        assert app.session.name == "tiny-test" and "tiny-test" in app.status.line
        said = [n for n in notices(app) if "other-tiny" in n]
        assert len(said) == 1 and "does not exist" in said[0] and "goes on with tiny-test" in said[0], said


async def test_a_chat_from_the_list_comes_back_with_its_model(make_app, data_dir, tmp_path):
    """Issue 34, item 4: Ctrl+O, Enter reopens the chat's model (in that chat, not a new one);
    a chat whose model is gone: one notice, and the model open stays."""
    other = other_model(tmp_path)
    for model, path in (("other-tiny", other), ("gone-model", tmp_path / "gone")):
        store = Store.open(data_dir, model=model)
        store.model_path = str(path)
        store.add(Saved("user", f"A question for {model}"))
        store.add(Saved("assistant", "An answer", model=model))
        store.close()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        first = app.session
        await pilot.press("ctrl+o", "down", "enter")  # the older chat: other-tiny's
        await wait_until(pilot, lambda: app.session is not None and app.session is not first
                         and len(app.session.messages) == 2, what="the chat in its own model")
        assert app.session.name == "other-tiny" and app.session.path == str(other.resolve())
        assert "other-tiny" in app.status.line and app.store.chat_model_path == str(other)
        cid = app.store.conversation
        await send(pilot, "More")
        assert app.store.conversation == cid and app.query(Reply).last().border_title == "other-tiny"
        assert any("other-tiny, is open again" in n for n in notices(app))
        await pilot.press("ctrl+o", "down", "enter")  # gone-model's chat
        await wait_until(pilot, lambda: [m.content for m in app.session.messages][:1] == ["A question for gone-model"],
                         what="the chat whose model is gone")
        said = [n for n in notices(app) if "gone-model" in n]
        assert len(said) == 1 and "does not exist" in said[0] and "goes on with other-tiny" in said[0], said
        assert app.session.name == "other-tiny"


def test_an_older_chat_db_gains_the_model_columns(tmp_path):
    """A chat.db from before chats kept their model's path: opened, its chats have none, and
    chat_app.chat_model says why such a chat cannot reopen its model."""
    with sqlite3.connect(tmp_path / "chat.db") as db:
        db.executescript(
            "CREATE TABLE conversations (id INTEGER PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL, "
            "system TEXT); CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL, "
            "role TEXT NOT NULL, content TEXT NOT NULL, stopped INTEGER NOT NULL DEFAULT 0);"
            "INSERT INTO conversations VALUES (1, 0, 'SmolLM2', NULL);"
            "INSERT INTO messages (conversation, role, content) VALUES (1, 'user', 'hi');")
    store = Store.open(tmp_path)
    saved, held = store.resume_last()
    assert [m.content for m in saved] == ["hi"] and not held
    assert store.chat_model == "SmolLM2" and store.chat_model_path is None and store.chat_model_spec is None
    assert locate(store.chat_model_path, store.chat_model_spec) == (None, NO_PATH)
    assert locate(None, "hf:me/one") == ("hf:me/one", "")  # a Hub model: fetched (or the cache) when opened
    store.close()


async def test_resume_with_a_model_the_loader_refuses_goes_on_with_the_default(ckpt, data_dir, tmp_path):
    """The chat's model passes the quick checks but not the loader's (a junk tokenizer): one
    notice, and the default model opens instead of the app ending."""
    broken = other_model(tmp_path, "broken-tiny")
    (broken / "tokenizer.model").write_bytes(b"junk")
    store = Store.open(data_dir, model="broken-tiny")
    store.model_path = str(broken)
    store.add(Saved("user", "Q"))
    store.add(Saved("assistant", "A", model="broken-tiny"))
    store.close()
    app = app_of("--resume", default=ckpt)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.session is not None and app.session.name == "tiny-test",
                         what="the default model")
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        said = [n for n in notices(app) if "broken-tiny" in n]
        assert len(said) == 1 and "goes on with tiny-test" in said[0] and app.bad_input is None, said
        assert "tiny-test" in app.status.line
