"""Item 5 of issue 13: a status bar that fits at 80 columns, notices that do not hide it,
and messages of a readable width at 200 columns."""

from __future__ import annotations

import pytest

from chat_app.widgets.reply import Reply
from chat_app.widgets.status_bar import StatusBar, shorten
from tests.chat_app.conftest import loaded, send, wait_until

pytestmark = pytest.mark.anyio
LONG = "Smollm2 135M 8k Lc100K Mix1 Ep2"


async def test_status_bar_fits_80_columns_and_notices_stay_above_it(make_app):
    app = make_app("--max-tokens", "3")
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        bar = app.query_one(StatusBar)
        bar.show(name=LONG, step="compiled", capped=True)
        shown = bar.shown
        assert len(shown) <= bar.content_size.width, shown
        for field in ("tok/s", "W ", "pos ", "/2048 cap", "ready", "Smollm2"):
            assert field in shown, (field, shown)
        assert LONG not in shown and "…" in shown  # the long name is shortened
        assert LONG in bar.line  # the whole line is still there for a wider terminal
        # issue 34, item 9: the least useful field goes first; the device and weights stay, and
        # (issue 46) so does the decode step: whether the fast path runs
        assert "cpu fp32" in shown and "compiled" in shown and "TTFT" not in shown and "TTFT" in bar.line, shown
        bar.show(state="generating", position=6141, max_len=8192, tok_s=123.0, window=8192)
        assert "cpu fp32" in bar.shown and "Smollm2" in bar.shown, bar.shown  # the longest live fields
        assert len(bar.shown) <= bar.content_size.width, bar.shown
        await pilot.resize_terminal(100, 24)
        await pilot.pause()
        bar.show(step="compiled")
        assert "cpu fp32" in bar.shown and len(bar.shown) <= bar.content_size.width, bar.shown
        assert "compiled" in bar.shown and "Smollm2 135M" in bar.shown, bar.shown
        bar.show(state="ready", position=18, max_len=2048, tok_s=99.0, window=128)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        app.say("A notice that would have covered the bar")
        await wait_until(pilot, lambda: app.screen.query("Toast"), what="the notice")
        await pilot.pause()
        toast = app.screen.query("Toast").last()
        assert toast.region.bottom <= bar.region.y  # above the bar: tok/s stays visible
        await pilot.resize_terminal(200, 40)
        await pilot.pause()
        assert LONG in bar.shown  # room for everything now
        await wait_until(pilot, lambda: app.query(Reply))
        assert app.query_one(Reply).region.width <= 120  # a readable width, not 200 columns


def test_shorten():
    assert shorten(LONG, 16) == "Smollm2 135M 8k…" and shorten("tiny", 16) == "tiny"


@pytest.mark.parametrize("quant, held", [("int8", "cpu int8"), ("int4", "cpu int4"), ("none", "cpu fp32")])
async def test_status_bar_shows_the_weights_as_held(make_app, quant, held):
    """Issue 34, item 9: a quantized model's matrices ("int4", "int8"), not its activations' float32."""
    app = make_app("--quant", quant)
    async with app.run_test(size=(100, 24)) as pilot:
        await loaded(pilot)
        assert held in app.status.shown, app.status.shown  # a tiny model: "int4+int8" (rows int4 cannot take)


@pytest.mark.parametrize("width", [80, 100])
async def test_every_footer_key_shows_whole(make_app, width):
    """At 80 and 100 columns the footer shows each of its keys with its whole label (Ctrl+G and
    F1 included), and Ctrl+P at its right end: none is cut or pushed off the screen."""
    app = make_app("--max-tokens", "3")
    async with app.run_test(size=(width, 24)) as pilot:
        await loaded(pilot)
        await pilot.pause()
        keys = list(app.query("FooterKey"))
        shown = {k.description: k for k in keys}
        assert {"Quit", "Stop", "Regen", "More", "New", "Chats", "Fast", "Help", "Commands"} <= set(shown), shown
        palette = shown["Commands"].region  # docked at the right: drawn over whatever reaches it
        for key in keys:
            assert key.region.width > 0 and key.region.right <= width, (key.description, key.region)
            assert key.description in key.render_line(0).text, (key.description, key.render_line(0).text)
            assert key is shown["Commands"] or key.region.right <= palette.x, [(k.description, k.region) for k in keys]


async def test_a_short_notice_passes_sooner_than_a_long_one(make_app):
    """Issue 46, item 6: notices covered the conversation 5 s each, whatever they said."""
    from chat_app.screen import notice_seconds

    assert notice_seconds("Copied.") < 3 < notice_seconds("word " * 12) <= 6 < notice_seconds("Failed.", "error")
    app = make_app()
    async with app.run_test(size=(100, 24), notifications=True) as pilot:
        await loaded(pilot)
        app.say("Copied.")
        await pilot.pause()
        assert list(app._notifications)[-1].timeout == notice_seconds("Copied.")
