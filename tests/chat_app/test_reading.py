"""Item 2 of issue 13: keys for reading and copying (all listed in F1)."""

from __future__ import annotations

import pytest

from chat_app.store import Saved, Store
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notices, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)
CODE_REPLY = "Two blocks:\n\n```python\nprint('hi')\n```\n\nand\n\n```\nsecond\n```\n\nDone."


def seed(data_dir) -> None:
    store = Store.open(data_dir, model="tiny-test")
    for i in range(6):  # taller than the screen
        store.add(Saved("user", f"Question {i}"))
        store.add(Saved("assistant", "\n\n".join(f"Paragraph {j} of answer {i}." for j in range(4)), model="m"))
    store.add(Saved("user", "Show me code"))
    store.add(Saved("assistant", CODE_REPLY, model="m"))
    store.close()


async def test_scroll_pick_and_copy_keys(make_app, data_dir):
    seed(data_dir)
    app = make_app("--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        conversation = app.query_one(Conversation)
        await wait_until(pilot, lambda: len(app.query(Reply)) == 7 and conversation.max_scroll_y > 0)
        await pilot.press("ctrl+t")
        assert app.clipboard == CODE_REPLY
        await pilot.press("home")  # the input is empty: Home/End/PgUp/PgDn scroll the conversation
        assert conversation.scroll_y == 0
        await pilot.press("pagedown")
        assert conversation.scroll_y > 0
        await pilot.press("end")
        assert conversation.scroll_y == conversation.max_scroll_y
        await pilot.press("pageup")
        assert conversation.scroll_y < conversation.max_scroll_y
        await pilot.press("tab")
        assert app.focused is conversation
        await pilot.press("up", "up")  # the last item is the second code block; one up: the first
        assert conversation.picked_text() == ("code block", "print('hi')")
        await pilot.press("c")
        assert app.clipboard == "print('hi')"
        await pilot.press("up")  # the reply itself
        await pilot.press("ctrl+c")  # Ctrl+C copies what is picked
        assert app.clipboard == CODE_REPLY
        await pilot.press("shift+tab")
        assert app.focused is app.prompt and conversation.picked is None
        await pilot.press("ctrl+c")  # nothing selected, nothing picked: a hint, no offer to quit
        assert any("Nothing selected" in n for n in notices(app))
        assert not any("quit?" in str(n.title).lower() for n in app._notifications)
        await pilot.press("h", "i", "shift+home", "ctrl+c")  # a selection in the input is copied
        assert app.clipboard == "hi"
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = "\n".join(f"{name} {does}" for name, does in app.screen.keys + app.screen.commands)  # its rows
        for key in ("PgUp / PgDn", "Ctrl+T", "Ctrl+C", "Ctrl+O", "Tab"):
            assert key in text, key
