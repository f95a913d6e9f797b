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


def test_without_a_child_the_thread_compiles_saves_and_a_relaunch_loads(ckpt):
    """spawn=False, a CUDA session's way under TINYLLM_CUDA_SAVED_STEP=1 (no child: it would hold the
    weights twice): the thread compiles the step here and saves it under the spec; the next compile of
    the same spec loads it (no trace), and the loaded step decodes as the plain step."""
    import torch

    from tinyllm.cuda_graph import GraphDecoder
    from tinyllm.decode.background_compile import BackgroundCompile
    from tinyllm.formats.open_model import open_any

    model = open_any(ckpt, torch.device("cpu"))[0]
    spec = Spec(os.path.abspath(ckpt), "cpu", "auto", 256, 1, None, True, "inductor")
    first = BackgroundCompile(model, 1, 256, "inductor", 1, greedy=True, child=spec, spawn=False)
    assert first.wait(600) and (first.state, first.error, first.child_result) == ("compiled", "", None)
    assert first.saved_from == "built" and saved_path(spec).exists() and not marker(spec).exists()
    again = BackgroundCompile(model, 1, 256, "inductor", 1, greedy=True, child=spec, spawn=False)
    assert again.wait(600) and (again.state, again.saved_from) == ("compiled", "loaded")

    runs, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # as the step was compiled (it is guarded on the thread count)
    try:
        for saved in (None, again.saved):
            dec = GraphDecoder(model, 1, max_len=256, use_graph=False)
            dec.greedy = True  # the variant compiled
            if saved is not None:
                dec.set_compile("inductor", saved)
            dec.prefill(torch.tensor([[1, 5, 9, 14]]))
            logits = []
            for t in (3, 8, 2, 7):  # teacher-forced: both read the same ids
                dec.tok.fill_(t)
                logits.append(dec.run(1)[0, -1].clone())
            runs.append(torch.stack(logits))
    finally:
        torch.set_num_threads(threads)
    assert isinstance(dec._step_fn, SavedStep) and dec._step_fn._step is None  # the loaded step ran
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-4, atol=1e-4)


def test_a_cuda_session_saves_its_step_only_under_its_switch(ckpt, monkeypatch):
    """Where a compile starts (StepPolicy.begin), a CUDA model opened from a path gets a spec and no
    child under TINYLLM_CUDA_SAVED_STEP=1, and no spec without it; a CPU one always both."""
    from types import SimpleNamespace

    import torch

    from tinyllm.cuda_graph import GraphDecoder
    from tinyllm.formats.open_model import open_any
    from tinyllm.kernels import switches
    from tinyllm.session import step_policy

    made = []
    monkeypatch.setattr(step_policy, "BackgroundCompile", lambda *a, **k: made.append(k) or SimpleNamespace())
    model = open_any(ckpt, torch.device("cpu"))[0]
    policy = step_policy.StepPolicy(model, GraphDecoder(model, 1, max_len=256, use_graph=False), "inductor",
                                    source=(str(ckpt), "auto"))
    policy.begin(True)
    assert made[-1]["child"].device == "cpu" and made[-1]["spawn"]
    policy.model = SimpleNamespace(device=torch.device("cuda"))  # as a CUDA session's model reads
    for on in (False, True):
        monkeypatch.setattr(switches, "SWITCHES", switches.read({"TINYLLM_CUDA_SAVED_STEP": "1"} if on else {}))
        policy.begin(True)
        child = made[-1]["child"]
        assert (child is not None) == on and not made[-1]["spawn"]
        assert not on or (child.device, child.path, child.greedy) == ("cuda", str(ckpt), True)


@pytest.mark.cuda
def test_a_cuda_session_under_its_switch_saves_its_step_and_a_relaunch_loads_it(ckpt, monkeypatch):
    """TINYLLM_CUDA_SAVED_STEP=1 on a GPU: the session compiles and saves the step in its own process, a
    relaunch loads it (no trace), and both reply as the plain step does, up to a near-tie. On a torch
    without the API (saved_step.supported(): the device's torch 2.11 lacks `aot_compile`) both launches
    compile the usual way, save nothing and reply the same."""
    from tinyllm.decode import saved_step
    from tinyllm.kernels import switches

    monkeypatch.setattr(switches, "SWITCHES", switches.read({"TINYLLM_CUDA_SAVED_STEP": "1"}))
    plain = open_session(ckpt, "cuda", max_len=256, compile=None)
    plain.set_param("max_tokens", "12")
    reply(plain, "hello there")
    api = saved_step.supported()
    for launch, how in (("first", "built" if api else ""), ("again", "loaded" if api else "")):
        s = open_session(ckpt, "cuda", max_len=256, compile="inductor")
        s.set_param("max_tokens", "12")
        assert s.wait_compiled(600), launch
        c = s.policy.background
        assert (c.state, c.error, c.child_result, c.saved_from) == ("compiled", "", None, how), launch
        assert (saved_path(c.child) is not None and saved_path(c.child).exists()) == api
        reply(s, "hello there")
        assert s.last_stats.step == "compiled"
        assert_replies_part_only_at_a_near_tie(s, plain)
        assert isinstance(s.decoder._step_fn, SavedStep) == api, launch
        assert not api or s.decoder._step_fn._step is None, launch
