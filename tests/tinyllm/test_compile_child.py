"""The step's first compile in a child process (tinyllm.compile_child): on a CPU a session's
background compile has a child fill the on-disk caches, once per spec, then compiles warm."""

import os

import pytest

from tinyllm.chat import Finished, open_session
from tinyllm.compile_child import Spec, marker, warm_up
from tinyllm.testing import make_tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold, and ours alone
    return make_tiny_checkpoint(tmp_path / "tiny", max_seq_len=256)


def reply(s, text):
    return [e for e in s.send(text) if isinstance(e, Finished)][-1].text


def test_a_cpu_session_compiles_in_a_child_first_and_only_once_per_spec(ckpt):
    plain = open_session(ckpt, "cpu", max_len=256, compile=None)
    plain.set_param("max_tokens", "12")
    want = reply(plain, "hello there")

    s = open_session(ckpt, "cpu", max_len=256)
    s.set_param("max_tokens", "12")
    assert s.wait_compiled(600)
    c = s._compile
    assert (c.state, c.error, c.child_result) == ("compiled", "", "")  # the child compiled it
    assert c.child.path == os.path.abspath(ckpt) and c.child.greedy
    assert marker(c.child).exists()
    assert reply(s, "hello there") == want and s.last_stats.step == "compiled"

    again = open_session(ckpt, "cpu", max_len=256)  # a relaunch: no child this time
    assert again.wait_compiled(600)
    assert (again._compile.state, again._compile.child_result) == ("compiled", "cached")


def test_a_child_that_fails_says_why_in_one_line_and_leaves_no_marker(ckpt, tmp_path):
    spec = Spec(str(tmp_path / "no-such-model"), "cpu", "none", 64, 1, None, True, "inductor")
    why = warm_up(spec)
    assert why and "\n" not in why and "no-such-model" in why
    assert not marker(spec).exists()
