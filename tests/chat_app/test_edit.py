"""Issue 34, item 7: edit and resend. Up in an empty prompt loads the last user message for
editing, Esc cancels, Enter replaces that turn and its reply (the reply a fresh chat that sent
the edit gives); the store keeps the old turn as another version of it (issue 46: reply
versions, tests/chat_app/test_versions.py), /edits lists it and /export marks which version it
wrote; a resumed chat shows the branch shown; an edit is refused while a reply runs."""

from __future__ import annotations

import sqlite3

import pytest

from chat_app.store import Saved, Store
from chat_app.versions import first_line
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.prompt_input import EDITING
from chat_app.widgets.reply import Reply, printable
from tests.chat_app.conftest import held_in_child, loaded, notes, notices, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def shown(app) -> list[str]:
    return [w.text for w in app.query(UserMessage)]


def said(app) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in app.session.messages]


def stored(data_dir) -> list[tuple[str, str, int | None]]:
    """(role, content, the row of its parent: 0 for none) of every row."""
    with sqlite3.connect(data_dir / "chat.db") as db:
        return db.execute("SELECT role, content, parent FROM messages ORDER BY id").fetchall()


async def replace(pilot, text: str) -> None:
    """Up in the empty prompt, the edit's text in place of the message, Enter; wait for its reply."""
    app = pilot.app
    await pilot.press("up")
    assert app.prompt.editing is not None
    app.prompt.load_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.busy and not app.prompt.text, what="the edit's reply")
    await pilot.pause()


async def test_up_in_an_empty_prompt_edits_the_last_message_and_esc_cancels(make_app):
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "first")
        await send(pilot, "second\nline two")
        before = said(app)
        await pilot.press("up")
        assert app.prompt.text == "second\nline two" and app.prompt.editing == "second\nline two"
        assert app.prompt.border_title == EDITING and app.prompt.has_class("-editing")
        assert app.prompt.cursor_location == (1, 8)  # at the end, to type on
        await pilot.press("!", "escape")
        assert app.prompt.text == "" and app.prompt.editing is None and app.prompt.border_title is None
        assert not app.busy and said(app) == before and shown(app) == ["first", "second\nline two"]
        # the earlier prompts stay a key away: Up again, on the edit's first line
        await pilot.press("up", "up")
        assert app.prompt.editing is not None and app.prompt.cursor_location == (0, 6)
        await pilot.press("up")
        assert app.prompt.text == "first" and app.prompt.editing is None  # the message edited is skipped
        await pilot.press("down")
        assert app.prompt.text == "second\nline two" and app.prompt.editing == "second\nline two"  # the edit again
        await pilot.press("escape")
        await send(pilot, "/clear")
        await wait_until(pilot, lambda: not app.session.messages, what="a new chat")
        await pilot.press("up")  # a new chat has no message to edit: Up recalls, as before
        assert app.prompt.text == "/clear" and app.prompt.editing is None
        await pilot.press("f1")  # F1 lists the key and the command
        assert ("Up (empty prompt)", "edit your last message: Enter replaces it and its reply (the old turn "
                "stays, a version: Ctrl+Left shows it), Esc cancels") in app.screen.keys
        assert any(name == "/edits" for name, _ in app.screen.commands)


async def test_enter_replaces_the_turn_and_its_reply_as_a_fresh_chat_would(make_app, data_dir, tmp_path):
    app = make_app("--max-tokens", "12")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello!")
        await send(pilot, "What is the capital of France?")
        old = said(app)
        await replace(pilot, "Tell me a joke.")
        assert [m for m, _ in said(app)] == ["user", "assistant"] * 2
        assert said(app)[:2] == old[:2] and said(app)[2][1] == "Tell me a joke."
        assert shown(app) == ["Hello!", "Tell me a joke."] and len(app.query(Reply)) == 2
        assert app.query(UserMessage).last().border_subtitle == "‹ 2/2 ›"
        assert app.query(Reply).last().text == printable(said(app)[3][1])
        edited = said(app)[3][1]
        assert stored(data_dir) == [("user", "Hello!", 0), ("assistant", old[1][1], 1),
                                    ("user", old[2][1], 2), ("assistant", old[3][1], 3),
                                    ("user", "Tell me a joke.", 2), ("assistant", edited, 5)]
        # /edits: the old message as a note; /export: the branch shown, the edit marked as a version
        await send(pilot, "/edits")
        assert notes(app)[-1].split("\n")[1:] == ["you, 2 of 2 (shown): Tell me a joke.", f"  1: {first_line(old[2][1])}"]
        path = tmp_path / "chat.md"
        await send(pilot, f"/export {path}")
        await wait_until(pilot, path.exists, what="the export")
        text = path.read_text()
        assert old[2][1] not in text and text.index("Tell me a joke.") < text.index("*(version 2 of 2)*")
        assert text.count("*(version") == 1  # the message; its reply has no other version
        # the same messages in a fresh chat: the same greedy reply
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.session.messages, what="a new chat")
        await send(pilot, "/edits")
        assert notes(app)[-1].startswith("No other versions in this chat")
        await send(pilot, "Hello!")
        await send(pilot, "Tell me a joke.")
        assert said(app)[3][1] == edited


async def test_a_resumed_chat_shows_only_the_turns_that_stand(make_app, data_dir):
    store = Store.open(data_dir)
    for role, text in (("user", "one"), ("assistant", "reply one"), ("user", "two"), ("assistant", "reply two")):
        store.add(Saved(role, text))
    store.branch(store.messages()[2])
    store.add(Saved("user", "two, edited"))
    store.add(Saved("assistant", "reply three"))
    store.close()
    app = make_app("--resume", "--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 4, what="the resumed chat")
        assert said(app) == [("user", "one"), ("assistant", "reply one"), ("user", "two, edited"),
                             ("assistant", "reply three")]
        assert shown(app) == ["one", "two, edited"] and [w.text for w in app.query(Reply)] == ["reply one", "reply three"]
        assert [w.border_subtitle for w in app.query(UserMessage)] == ["", "‹ 2/2 ›"]
        await send(pilot, "/edits")
        assert "  1: two" in notes(app)[-1] and "reply two" not in notes(app)[-1]  # its reply: not this branch's
        await replace(pilot, "two, again")  # an edit of an edit: both earlier versions kept
        assert said(app)[2] == ("user", "two, again")
        assert app.query(UserMessage).last().border_subtitle == "‹ 3/3 ›"
    assert [r for r in stored(data_dir) if r[2] == 2] == [("user", "two", 2), ("user", "two, edited", 2),
                                                          ("user", "two, again", 2)]


def test_a_chat_db_from_before_edits_opens(data_dir):
    """The columns `replaced`, `parent` and `leaf` are added to an older chat.db; its rows stand in order."""
    data_dir.mkdir(parents=True)
    with sqlite3.connect(data_dir / "chat.db") as db:
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL,
                                        system TEXT, title TEXT, settings TEXT, updated REAL, model_path TEXT,
                                        model_spec TEXT);
            CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL, role TEXT NOT NULL,
                                   content TEXT NOT NULL, stopped INTEGER NOT NULL DEFAULT 0,
                                   partial INTEGER NOT NULL DEFAULT 0, model TEXT);
            CREATE TABLE prompts (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
            INSERT INTO conversations (id, created, model) VALUES (1, 0, 'tiny');
            INSERT INTO messages (conversation, role, content) VALUES (1, 'user', 'old'), (1, 'assistant', 'chat');
        """)
    store = Store.open(data_dir)
    try:
        assert [(m.role, m.content) for m in store.resume_last()[0]] == [("user", "old"), ("assistant", "chat")]
        store.branch(store.messages()[0])
        store.add(Saved("user", "new"))
        assert [m.content for m in store.messages()] == ["new"]
        assert [m.content for m in store.versions(store.messages()[0])] == ["old", "new"]
        assert [info.n_messages for info in store.chats()] == [1]  # the chat list counts what stands
    finally:
        store.close()
    assert stored(data_dir) == [("user", "old", None), ("assistant", "chat", None), ("user", "new", 0)]


async def test_an_edit_is_refused_while_a_reply_runs_and_esc_cancels_it_first(make_app):
    app = held_in_child(make_app("--max-tokens", "100000", "--ignore-eos"))  # the first reply ends only at Esc
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a long story", wait=False)
        await wait_until(pilot, lambda: app.query(Reply) and app.query_one(Reply).text, what="streamed text")
        await pilot.press("up")
        assert app.prompt.editing == "Tell me a long story"
        app.prompt.load_text("Tell me a short story")
        await pilot.press("enter")  # refused: the text stays, still an edit
        assert any("A reply is still running" in n for n in notices(app))
        assert app.prompt.text == "Tell me a short story" and app.prompt.editing == "Tell me a long story"
        assert app.busy and shown(app) == ["Tell me a long story"]
        await pilot.press("escape")  # Esc cancels the edit first; the reply goes on
        assert app.prompt.text == "" and app.prompt.editing is None and app.busy
        await pilot.press("escape")  # then stops the reply
        await wait_until(pilot, lambda: not app.busy, what="the reply to stop")
        await replace(pilot, "Tell me a short story")
        assert shown(app) == ["Tell me a short story"] and len(app.query(Reply)) == 1
        assert said(app)[0] == ("user", "Tell me a short story") and len(said(app)) == 2


async def test_an_edit_refused_by_the_session_comes_back_as_an_edit(make_app):
    app = make_app("--max-len", "128", "--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello!")
        before = said(app)
        long = "word " * 200
        await pilot.press("up")
        app.prompt.load_text(long)
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and app.prompt.text, what="the refusal")
        assert any("message too long" in n for n in notices(app))
        assert app.prompt.text == long.strip() and app.prompt.editing == "Hello!"
        assert said(app) == before and shown(app) == ["Hello!"]
        # the chat changed since Up (a new chat): Enter says so, and then sends it as a new message
        app.prompt.load_text("Hi")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.session.messages, what="a new chat")
        await pilot.press("enter")
        assert any("no longer the chat's last one" in n for n in notices(app)) and app.prompt.editing is None
        await send(pilot, "Hi")
        assert shown(app) == ["Hi"] and said(app)[0] == ("user", "Hi")
