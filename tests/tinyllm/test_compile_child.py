"""The step's first compile in a child process (tinyllm.decode.compile_child): on a CPU a session's
background compile has a child compile the step and save it (tinyllm.decode.saved_step), once per
spec; the session, and every relaunch, loads it."""

import os

import pytest

from tests.tinyllm.forced import assert_replies_part_only_at_a_near_tie
from tinyllm.decode.compile_child import Spec, marker, saved_path, warm_up
from tinyllm.decode.saved_step import SavedStep
from tinyllm.session.chat import Finished, open_session
from tinyllm.tools.testing import make_tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold, and ours alone
    return make_tiny_checkpoint(tmp_path / "tiny", max_seq_len=256)


def reply(s, text):
    return [e for e in s.send(text) if isinstance(e, Finished)][-1].text


def test_a_cpu_session_compiles_in_a_child_first_and_only_once_per_spec(ckpt):
    plain = open_session(ckpt, "cpu", max_len=256, compile=None)
    plain.set_param("max_tokens", "12")
    reply(plain, "hello there")

    s = open_session(ckpt, "cpu", max_len=256, compile="inductor")
    s.set_param("max_tokens", "12")
    assert s.wait_compiled(600)
    c = s.policy.background
    assert (c.state, c.error, c.child_result) == ("compiled", "", "")  # the child compiled it
    assert c.child.path == os.path.abspath(ckpt) and c.child.greedy
    assert marker(c.child).exists() and saved_path(c.child).exists()  # and saved the step
    assert c.saved_from == "loaded"  # which this process loaded: no trace here
    reply(s, "hello there")
    assert s.last_stats.step == "compiled"
    assert_replies_part_only_at_a_near_tie(s, plain)  # compiled against plain: equal up to a near-tie
    assert isinstance(s.decoder._step_fn, SavedStep) and s.decoder._step_fn._step is None

    again = open_session(ckpt, "cpu", max_len=256, compile="inductor")  # a relaunch: no child, no trace
    again.set_param("max_tokens", "12")
    assert again.wait_compiled(600)
    c = again.policy.background
    assert (c.state, c.child_result, c.saved_from) == ("compiled", None, "loaded")
    reply(again, "hello there")
    assert again.last_stats.step == "compiled"
    assert_replies_part_only_at_a_near_tie(again, plain)


def test_a_child_that_fails_says_why_in_one_line_and_leaves_no_marker(ckpt, tmp_path):
    spec = Spec(str(tmp_path / "no-such-model"), "cpu", "none", 64, 1, None, True, "inductor")
    why = warm_up(spec)
    assert why and "\n" not in why and "no-such-model" in why
    assert not marker(spec).exists()
