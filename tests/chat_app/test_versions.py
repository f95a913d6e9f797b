"""Issue 46, item 3: reply versions. Ctrl+R and an edit keep what they replace as another
version; each message has a parent and the chat its leaf (chat_app.store, chat_app.branches);
the border says "‹ 2/3 ›", Ctrl+Left/Right in an empty prompt and Left/Right on a picked
message move between versions; what is shown is what the next turn continues from; the
store keeps every branch; /edits, /export and the chat list follow the branch shown."""

from __future__ import annotations

import sqlite3

import pytest

from chat_app.store import Saved, Store
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply, printable
from tests.chat_app.conftest import loaded, notes, notices, regenerate, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def texts(messages) -> list[str]:
    return [m.content for m in messages]


def said(app) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in app.session.messages]


def borders(app) -> list[str]:
    return [w.border_subtitle or "" for w in app.query("UserMessage, Reply")]


def add(store: Store, *pairs: tuple[str, str]) -> list[Saved]:
    out = [Saved(role, text) for role, text in pairs]
    for m in out:
        store.add(m)
    return out


# ---- the store: a tree, one branch shown --------------------------------------------------

def test_versions_are_kept_and_a_switch_shows_the_newest_branch_under_it(data_dir):
    store = Store.open(data_dir)
    u1, a1 = add(store, ("user", "one"), ("assistant", "reply 1"))
    store.branch(a1)  # Ctrl+R
    (a1b,) = add(store, ("assistant", "reply 1b"))
    u2, a2 = add(store, ("user", "two"), ("assistant", "reply 2"))
    store.branch(u2)  # an edit of "two"
    u2b, a2b = add(store, ("user", "two, edited"), ("assistant", "reply 2b"))
    assert texts(store.messages()) == ["one", "reply 1b", "two, edited", "reply 2b"]
    assert store.versions(a1b) == [a1, a1b] and store.versions(u2b) == [u2, u2b] and store.versions(u1) == [u1]

    assert texts(store.switch(a1)) == ["one", "reply 1"]  # nothing was said after the first reply
    assert texts(store.switch(a1b)) == ["one", "reply 1b", "two, edited", "reply 2b"]  # the newest under it
    assert texts(store.switch(u2)) == ["one", "reply 1b", "two", "reply 2"]
    text, n = store.as_markdown()
    assert n == 4 and "two, edited" not in text and "reply 1\n" not in text
    assert text.count("*(version 2 of 2)*") == 1 and text.count("*(version 1 of 2)*") == 1  # reply 1b; "two"
    store.close()

    again = Store.open(data_dir)  # every branch kept, the one shown too
    try:
        assert texts(again.resume_last()[0]) == ["one", "reply 1b", "two", "reply 2"]
        assert len(again.chat.messages) == 7
        assert [(info.n_messages, info.title) for info in again.chats()] == [(4, "one")]
        assert [info.id for info in again.chats("two, edited")] == [again.conversation]  # any version is found
    finally:
        again.close()


def test_an_empty_reply_is_not_kept_as_a_version(data_dir):
    store = Store.open(data_dir)
    try:
        _, empty = add(store, ("user", "one"), ("assistant", ""))  # a reply that never began
        store.branch(empty)
        (reply,) = add(store, ("assistant", "reply"))
        assert store.versions(reply) == [reply] and texts(store.chat.messages) == ["one", "reply"]
    finally:
        store.close()
    with sqlite3.connect(data_dir / "chat.db") as db:
        assert db.execute("SELECT content FROM messages ORDER BY id").fetchall() == [("one",), ("reply",)]


def test_a_chat_db_from_before_branches_gets_its_tree_inferred(data_dir):
    """Rows without parents: the standing ones in order, each turn an edit replaced beside the edit."""
    data_dir.mkdir(parents=True)
    with sqlite3.connect(data_dir / "chat.db") as db:
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL,
                                        system TEXT, title TEXT, settings TEXT, updated REAL, model_path TEXT,
                                        model_spec TEXT);
            CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL, role TEXT NOT NULL,
                                   content TEXT NOT NULL, stopped INTEGER NOT NULL DEFAULT 0,
                                   partial INTEGER NOT NULL DEFAULT 0, model TEXT,
                                   replaced INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE prompts (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
            INSERT INTO conversations (id, created, model) VALUES (1, 0, 'tiny');
            INSERT INTO messages (conversation, role, content, replaced) VALUES
                (1, 'user', 'one', 0), (1, 'assistant', 'reply one', 0),
                (1, 'user', 'two', 1), (1, 'assistant', 'reply two', 1),
                (1, 'user', 'two, edited', 1), (1, 'assistant', 'reply three', 1),
                (1, 'user', 'two, again', 0), (1, 'assistant', 'reply four', 0);
        """)
    store = Store.open(data_dir)
    try:
        branch = store.resume_last()[0]
        assert texts(branch) == ["one", "reply one", "two, again", "reply four"]
        assert texts(store.versions(branch[2])) == ["two", "two, edited", "two, again"]
        assert texts(store.switch(store.versions(branch[2])[1])) == ["one", "reply one", "two, edited", "reply three"]
        assert [info.n_messages for info in store.chats()] == [4]
        add(store, ("user", "three"), ("assistant", "reply five"))
    finally:
        store.close()
    store = Store.open(data_dir)
    try:  # the old rows inferred again, the new ones where they were put
        assert texts(store.resume_last()[0]) == ["one", "reply one", "two, edited", "reply three", "three",
                                                 "reply five"]
    finally:
        store.close()


def test_a_hand_edited_tree_never_loops_and_keeps_what_it_can_read(data_dir):
    store = Store.open(data_dir)
    add(store, ("user", "one"), ("assistant", "reply one"), ("user", "two"), ("assistant", "reply two"))
    store.close()
    with sqlite3.connect(data_dir / "chat.db") as db:
        db.execute("UPDATE messages SET parent = 4 WHERE content = 'one'")  # a cycle, were it followed
        db.execute("UPDATE messages SET content = X'00' WHERE content = 'two'")  # not text: skipped
    store = Store.open(data_dir)
    try:
        assert texts(store.resume_last()[0]) == ["one", "reply one", "reply two"] and store.skipped == 1
        assert [info.n_messages for info in store.chats()] == [3]
    finally:
        store.close()


# ---- the app ------------------------------------------------------------------------------

async def test_three_versions_of_a_reply_and_the_next_turn_continues_the_one_shown(make_app):
    # --ignore-eos: a reply of no text is no version to keep (Ctrl+R drops it: Store.branch), and
    # at temperature 1 the tiny model ended one of about 300 replies at once (CI saw 2 versions)
    app = make_app("--max-tokens", "6", "--temperature", "1.0", "--ignore-eos")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello!")
        for _ in range(2):
            await regenerate(pilot)
        versions = app.store.versions(app.store.messages()[-1])
        assert len(versions) == 3 and borders(app) == ["", "‹ 3/3 ›"] and len(app.query(Reply)) == 1
        assert said(app)[-1] == ("assistant", versions[2].content)

        await pilot.press("ctrl+left")  # the empty prompt: the last reply's version before
        await wait_until(pilot, lambda: said(app)[-1] == ("assistant", versions[1].content), what="the session")
        # (the reply shows a random text's control characters as symbols: printable)
        assert borders(app) == ["", "‹ 2/3 ›"] and app.query_one(Reply).raw == printable(versions[1].content)
        await pilot.press("ctrl+left", "ctrl+left")  # past the first: said, nothing changes
        await wait_until(pilot, lambda: said(app)[-1] == ("assistant", versions[0].content), what="the first")
        assert borders(app) == ["", "‹ 1/3 ›"] and any("first of 3 versions" in n for n in notices(app))
        await pilot.press("ctrl+right")
        await wait_until(pilot, lambda: borders(app) == ["", "‹ 2/3 ›"], what="the second again")

        await send(pilot, "And then?")  # continues from version 2
        assert said(app)[1] == ("assistant", versions[1].content) and len(said(app)) == 4
        assert [m.content for m in app.store.messages()][:2] == ["Hello!", versions[1].content]

        await pilot.press("tab", "home", "down")  # pick the first reply, then its version after
        assert app.conversation.picked is app.query(Reply).first()
        await pilot.press("right")
        await wait_until(pilot, lambda: len(said(app)) == 2, what="the branch through version 3")
        assert said(app)[1] == ("assistant", versions[2].content) and borders(app) == ["", "‹ 3/3 ›"]
        assert app.conversation.picked is app.query(Reply).first()  # still picked: Left goes back
        await pilot.press("left")
        await wait_until(pilot, lambda: len(said(app)) == 4, what="version 2 and the turn after it")
        assert [w.text for w in app.query(UserMessage)] == ["Hello!", "And then?"]
        assert borders(app) == ["", "‹ 2/3 ›", "", ""]

        await pilot.press("shift+tab")
        await send(pilot, "/edits")
        assert notes(app)[-1].startswith("Versions of the messages shown") and "reply, 2 of 3 (shown)" in notes(app)[-1]


async def test_an_edit_keeps_the_old_turn_as_a_version(make_app):
    app = make_app("--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "first")
        old = said(app)
        await pilot.press("up")
        app.prompt.load_text("first, edited")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and not app.prompt.text, what="the edit's reply")
        assert said(app)[0] == ("user", "first, edited") and borders(app) == ["‹ 2/2 ›", ""]
        await pilot.press("ctrl+left")  # the last reply has no other version: the message has
        await wait_until(pilot, lambda: said(app) == old, what="the old turn, in the session")
        assert [w.text for w in app.query(UserMessage)] == ["first"] and borders(app) == ["‹ 1/2 ›", ""]
        assert app.query_one(Reply).raw == old[1][1]


async def test_a_switch_waits_for_the_reply(make_held_app):
    app, opened = make_held_app("--max-tokens", "100000", "--ignore-eos")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me a story", wait=False)
        await wait_until(pilot, lambda: opened and opened[0].held.is_set(), what="the reply to stream")
        app.post_message(app.prompt.Versions(-1))
        await wait_until(pilot, lambda: any("Wait for the reply" in n for n in notices(app)), what="the refusal")
        assert app.busy and [w.text for w in app.query(UserMessage)] == ["Tell me a story"]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.busy, what="the stop")


async def test_a_resumed_chat_shows_its_versions(make_app, data_dir):
    store = Store.open(data_dir)
    _, a1 = add(store, ("user", "one"), ("assistant", "reply one"))
    store.branch(a1)
    add(store, ("assistant", "reply one, again"))
    store.close()
    app = make_app("--resume", "--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        assert borders(app) == ["", "‹ 2/2 ›"] and said(app)[1] == ("assistant", "reply one, again")
        await pilot.press("ctrl+left")
        await wait_until(pilot, lambda: said(app)[1] == ("assistant", "reply one"), what="the first version")
