"""chat_app.bench compares like with like: its session side samples with the app's settings."""

import pytest

from chat_app import bench
from chat_app.__main__ import APP_DRY_MULTIPLIER, REPEAT_STOP
from tinyllm.session import chat


class Opened(Exception):
    pass


def test_the_session_side_samples_as_the_app_does(ckpt, monkeypatch):
    """DRY and the repetition stop as the app has them (the default and as given), and the
    bench's fixed reply length: a session side without them charged their cost to the UI."""
    seen = []

    def open_session(*args, params, **kwargs):
        seen.append(params)
        raise Opened

    monkeypatch.setattr(chat, "open_session", open_session)
    for argv, dry, stop in (([], APP_DRY_MULTIPLIER, REPEAT_STOP), (["--dry-multiplier", "0.3", "--repeat-stop", "5"],
                                                                    0.3, 5)):
        ours, args = bench.parse(["--model", str(ckpt), "--device", "cpu", "--tokens", "7", *argv])
        with pytest.raises(Opened):
            bench.session_side(args, ours, report=None)
        assert (seen[-1].dry_multiplier, seen[-1].repeat_stop, seen[-1].max_tokens) == (dry, stop, 7)
    assert APP_DRY_MULTIPLIER > 0 and REPEAT_STOP > 0  # the defaults are on: the check above could fail
