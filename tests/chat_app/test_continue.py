"""Item 3 of issue 13: /continue (and Ctrl+F), and a reply limit that suits chatting."""

from __future__ import annotations

import pytest

from chat_app.__main__ import DEFAULT_MAX_TOKENS
from chat_app.widgets.reply import Reply, printable
from tests.chat_app.conftest import loaded, notices, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


async def test_continue_extends_the_last_reply(make_app, data_dir):
    app = make_app("--max-len", "256", "--ignore-eos")  # no --max-tokens: the default, capped by the context
    assert app.open_session.args[0]["params"].max_tokens == DEFAULT_MAX_TOKENS == 1024
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.session.params.max_tokens == 256  # 1,024 does not fit in 256 positions
        await send(pilot, "/continue")
        assert any("No reply to continue" in n for n in notices(app))
        await send(pilot, "/set max_tokens 5")
        await send(pilot, "Tell me more")
        first = app.session.messages[-1].content
        assert app.query_one(Reply).has_class("-noted")  # "max_tokens reached"
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: not app.busy and app.session.messages[-1].content != first,
                         what="the continued reply")
        await send(pilot, "/continue")
        await wait_until(pilot, lambda: not app.busy)
        whole = app.session.messages[-1].content
        assert whole.startswith(first) and len(whole) > len(first)
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert app.session.last_stats.tokens == 5  # each continuation: up to max_tokens more
        assert len(app.query(Reply)) == 1 and app.query_one(Reply).text == printable(whole)
    assert [(m.role, m.content) for m in saved_chat(data_dir)] == [("user", "Tell me more"), ("assistant", whole)]
