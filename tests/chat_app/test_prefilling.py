"""A message is shown the moment it is sent, and the status bar says "prefilling" while its
prompt is read (before: a 4,500-token paste into SmolLM2 showed nothing, with "ready" on the
status bar, for the 30 s of its prefill, 2026-12-06); a message the session refuses leaves the
conversation and goes back to the input."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import Held, loaded, notices, rows, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


class HeldPrefill(Held):
    """The app's session whose replies wait before their first event (the prompt being read)
    until `release()`."""

    def send(self, text: str) -> Iterator:
        self.held.set()
        self.gate.wait(timeout=300)
        return self._session.send(text)


def users(app) -> list[str]:
    return [m.text for m in app.query(UserMessage)]


async def test_a_message_is_shown_while_its_prompt_is_read(make_held_app, data_dir):
    app, opened = make_held_app("--max-tokens", "4", wrapper=HeldPrefill)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me about the sea", wait=False)
        await wait_until(pilot, opened[0].held.is_set, what="the reply to be held before its prefill")
        await pilot.pause()
        assert users(app) == ["Tell me about the sea"] and not app.query(Reply)
        assert app.status.fields["state"] == "prefilling" and app.prompt.text == ""
        opened[0].release()
        await wait_until(pilot, lambda: not app.busy, what="the reply")
        assert users(app) == ["Tell me about the sea"] and len(app.query(Reply)) == 1  # shown once
        assert app.status.fields["state"] == "ready"
        assert [(r[2], r[3]) for r in rows(data_dir)][0] == ("user", "Tell me about the sea")


async def test_a_refused_message_leaves_the_conversation_for_the_input(make_app):
    app = make_app("--max-len", "128", "--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello!")
        long = "word " * 200
        app.prompt.load_text(long)
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and app.prompt.text, what="the refusal")
        assert any("message too long" in n for n in notices(app))
        assert app.prompt.text == long.strip() and users(app) == ["Hello!"]
        assert app.status.fields["state"] == "ready"
