"""Issue 46, item 1: a reply that loops ends "■ repeating" (through the model process's typed
protocol), and Ctrl+F continues it; /set and config.toml switch the stop and DRY."""

from __future__ import annotations

import pytest
from textual.widgets import Static

from chat_app import config
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notices, saved_chat, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


async def test_a_looping_reply_is_marked_repeating_and_ctrl_f_continues_it(make_app, data_dir):
    # The tiny random model without a repetition penalty says a short cycle again and again.
    app = make_app("--max-len", "1024", "--ignore-eos", "--repeat-penalty", "1", "--repeat-stop", "on")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.session.params.repeat_stop == 3
        await send(pilot, "hi")
        first = app.session.messages[-1].content
        assert app.session.last_stats.tokens < 300, "stopped long before max_tokens and the context"
        reply = app.query_one(Reply)
        assert reply.has_class("-noted") and "■ repeating" in str(reply.query_one(".note", Static).render())
        assert any("Ctrl+F continues it" in n for n in notices(app))
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: not app.busy and app.session.messages[-1].content != first,
                         what="the continued reply")
        whole = app.session.messages[-1].content
        assert whole.startswith(first) and len(whole) > len(first)
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert "■ repeating" in str(app.query_one(Reply).query_one(".note", Static).render())  # it loops on
        await send(pilot, "/set repeat_stop off")
        assert app.session.params.repeat_stop == 0
        await send(pilot, "/set dry_multiplier 0.8")
        assert app.session.params.dry_multiplier == 0.8
    assert saved_chat(data_dir)[-1].content == whole


def test_config_toml_sets_the_loop_settings(tmp_path):
    file = tmp_path / "config.toml"
    file.write_text("repeat_stop = 0\ndry_multiplier = 0.8\ndry_base = 2\ndry_allowed_length = 3\ndry_last_n = 256\n")
    assert config.load(file) == {"repeat_stop": 0, "dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3,
                                 "dry_last_n": 256}
    file.write_text("dry_last_n = 5000\n")
    with pytest.raises(ValueError, match="dry_last_n must be from 1 to 1024"):
        config.load(file)


def test_the_apps_defaults_stop_loops():
    from chat_app.__main__ import build_parser
    from tinyllm.decode.sampling_params import DRY_MULTIPLIER, REPEAT_STOP

    args = build_parser().parse_args([])
    assert (args.repeat_stop, args.dry_multiplier) == (REPEAT_STOP, DRY_MULTIPLIER) == (3, 0.8)
    assert build_parser().parse_args(["--repeat-stop", "off"]).repeat_stop == 0
