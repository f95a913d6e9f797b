"""SVG snapshots: the app after loading (no reply: nothing time-dependent on screen) and the
help screen. Update with `pytest tests/chat_app --snapshot-update` after a deliberate change."""

from __future__ import annotations

from tests.chat_app.conftest import loaded

SIZE = (100, 30)


async def _ready(pilot) -> None:
    app = await loaded(pilot)
    app.prompt.cursor_blink = False
    await pilot.pause()


def test_snapshot_after_loading(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_ready)


def test_snapshot_help(snap_compare, make_app):
    async def help_open(pilot) -> None:
        await _ready(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=help_open)
