"""tinyllm.kernels.precompile: a capture's Triton kernels compiled at once on a thread pool, then none
(TINYLLM_PRECOMPILE=1; off by default until its CUDA test has run on a GPU).

On the CPU (Triton installed, no GPU): the routing alone. Inside `ahead`, this thread's launches
reach Triton's launcher as warm-ups and other threads' as launches, and the launcher is put
back, after an error too. On CUDA (a child process, so that Triton's caches start empty, and
an empty cache on disk): a GraphDecoder's capture compiles every kernel of its plain step in the
precompile and none after it, and its replays equal the eager twin bit for bit over 300 steps."""

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tinyllm.kernels import precompile, switches

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_inside_ahead_this_threads_launches_are_warm_ups_and_the_launcher_comes_back(monkeypatch):
    from triton.runtime import _async_compile
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(switches, "SWITCHES", switches.read({"TINYLLM_PRECOMPILE": "1"}))

    calls = []  # (thread, warmup) of each call that reached the launcher

    def launcher(self, *args, grid, warmup, **kwargs):
        calls.append((threading.current_thread().name, warmup))

    monkeypatch.setattr(JITFunction, "run", launcher)

    def step():
        JITFunction.run(None, grid=(1,), warmup=False)
        other = threading.Thread(target=lambda: JITFunction.run(None, grid=(1,), warmup=False), name="other")
        other.start()
        other.join()

    assert precompile.ahead(step, threads=2) == 0  # the launcher compiled nothing
    here = threading.current_thread().name
    assert calls == [(here, True), ("other", False)]
    assert JITFunction.run is launcher

    def fails():
        raise RuntimeError("a step that fails")

    with pytest.raises(RuntimeError, match="a step that fails"):
        precompile.ahead(fails)
    assert JITFunction.run is launcher and _async_compile.active_mode.get() is None
    JITFunction.run(None, grid=(1,), warmup=False)
    assert calls[-1] == (here, False)


def test_off_by_default_it_runs_nothing(monkeypatch):
    ran = []
    for env in ({}, {"TINYLLM_PRECOMPILE": "0"}):
        monkeypatch.setattr(switches, "SWITCHES", switches.read(env))
        assert precompile.ahead(lambda: ran.append(1)) == 0
    assert ran == []


CHILD = textwrap.dedent("""
    import torch
    from triton import knobs
    from tests.tinyllm.test_cuda_graph_cuda import run
    from tinyllm.cuda_graph import GraphDecoder
    from tinyllm.kernels import precompile
    from tinyllm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", vocab_size=1024, dim=128, n_layers=4, n_heads=4, n_kv_heads=2,
                                ffn_dim=344, max_seq_len=512)
    model = Transformer(cfg).init_weights(0).to("cuda", torch.bfloat16).eval()
    compiles = []  # for each compile: was it the precompile's?
    knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiles.append(getattr(precompile._dry, "on", False))
    prompt = torch.randint(0, 1024, (1, 100), device="cuda")
    graph = GraphDecoder(model, 1, max_len=512, use_graph=True)
    graph.prefill(prompt)  # the prefill's own kernels compile as it launches them
    before = len(compiles)
    graph.capture()  # every bucket's graph
    during = compiles[before:]
    assert graph.precompiled > 0 and during and all(during), (graph.precompiled, during)
    t_graph, l_graph = run(graph, prompt, 300)
    t_eager, l_eager = run(GraphDecoder(model, 1, max_len=512, use_graph=False), prompt, 300)
    assert graph.captured_windows == [128, 256, 512]
    assert torch.equal(t_graph, t_eager) and torch.equal(l_graph, l_eager)
    assert all(compiles[before:]), "a kernel compiled after the precompile"
    print("ok", graph.precompiled, len(during))
""")


@pytest.mark.cuda
def test_a_capture_compiles_its_kernels_at_once_then_none(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": str(tmp_path / "triton"), "TINYLLM_PRECOMPILE": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-4000:]
