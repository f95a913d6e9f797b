"""decode_attention (split-K Triton kernel) against window_attention and a float64 reference,
and the fused rope_decode_attention against its twin, over a static cache (one position) and
a slot cache (a position per slot: SlotKVCache's decode view, the engine's compiled step).

The CUDA tests run on the H200 (skipped without CUDA: a skip is not a pass). The interpreter
tests run the same kernels on a CPU under Triton's interpreter (TRITON_INTERPRET=1, in a
subprocess so that the variable is set before Triton is imported, on this process's
PYTHONPATH: Triton may be installed outside the venv); they are skipped where Triton is not
installed (CI). The interpreter computes tl.dot on bf16 wrongly (measured with Triton 3.9:
values off by 1e9), so they run fp16; bf16 is tested on CUDA."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tinyllm.core.ops import window_attention
from tinyllm.kernels import decode_attention as da

ROOT = Path(__file__).resolve().parents[2]


def make_case(B, Hkv, R, D, W, *, rows=None, dtype=torch.bfloat16, device="cuda", seed=0):
    """q (B, Hkv, R, D); k, v (B, Hkv, W, D) slices of a (B, Hkv, rows, D) cache."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = rows or W + 37
    q = torch.randn(B, Hkv, R, D, generator=g).to(device, dtype)
    kc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    vc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    return q, kc[:, :, :W], vc[:, :, :W]


def window_mask(W, first_valid, pos, device="cuda"):
    """(B, 1, 1, W) bool: keys first_valid[b] .. pos[b], as _StaticDecode.begin_step builds it."""
    k_pos = torch.arange(W, device=device)
    fv = torch.tensor(first_valid, device=device)[:, None]
    p = torch.tensor(pos, device=device)[:, None]
    return ((k_pos <= p) & (k_pos >= fv))[:, None, None, :]


def masks_for(B, W):
    """Windows to test: full, a single key at 0, the last key only, whole blocks masked at
    both ends, and (B=2) two rows with different windows."""
    out = [([0] * B, [W - 1] * B), ([0] * B, [0] * B), ([W - 1] * B, [W - 1] * B),
           ([min(W - 1, 70)] * B, [max(70, W - 80)] * B)]
    if B == 2:
        out.append(([0, W // 2 + 3], [W // 3, W - 1]))
    return out


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_rope_case(B, Hkv, R, D, W, first_valid, pos, *, dtype=torch.bfloat16, device="cuda", tol=1e-2, seed=0,
                    sliding=0, cap=0.0):
    """rope_decode_attention against its slow twin: apply_rope, index_copy_ into the caches,
    window_attention (and the same in float64). The caches hold NaN past pos and before
    first_valid (never read); afterwards they differ from the twin's only at pos, by rounding.
    `sliding` > 0: a sliding-window layer's last `sliding` keys (NaN before them: never read
    either); `cap`: soft-capped scores."""
    from tinyllm.model import Rope, apply_rope

    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = W + 37
    qkv = torch.randn(B, (R + 2) * Hkv * D, generator=g).to(device, dtype)
    kc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    vc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    rope = Rope(D, max(4096, rows), 10000.0, device)
    p = torch.tensor([pos], device=device)
    cos, sin = rope.cos.index_select(0, p), rope.sin.index_select(0, p)  # (1, D/2): _StaticDecode.begin_step
    if sliding:
        first_valid = [max(f, pos - sliding + 1) for f in first_valid]
    mask = window_mask(W, first_valid, [pos] * B, device=device)
    scale = D ** -0.5

    q, k, v = qkv[:, None].split([R * Hkv * D, Hkv * D, Hkv * D], dim=-1)  # (B, 1, n) each
    q = apply_rope(q.view(B, 1, Hkv * R, D).transpose(1, 2), cos, sin).view(B, Hkv, R, D)
    k = apply_rope(k.view(B, 1, Hkv, D).transpose(1, 2), cos, sin)  # (B, Hkv, 1, D)
    v = v.view(B, 1, Hkv, D).transpose(1, 2)
    kc_ref, vc_ref = kc.clone().index_copy_(2, p, k), vc.clone().index_copy_(2, p, v)
    ref = window_attention(q.double(), kc_ref[:, :, :W].double(), vc_ref[:, :, :W].double(), mask, scale, cap)

    for b in range(B):  # what the reference never reads either
        for x in (kc, vc, kc_ref, vc_ref):
            x[b, :, pos + 1:], x[b, :, :first_valid[b]] = float("nan"), float("nan")
        kc[b, :, pos], vc[b, :, pos] = float("nan"), float("nan")  # the kernel's to write
    fv = torch.tensor(first_valid, device=device)
    y = da.rope_decode_attention(qkv, rope.cos, rope.sin, p, fv, kc, vc, W, scale, sliding, cap)  # writes at pos
    case = (B, Hkv, R, D, W, first_valid, pos, sliding, cap)
    assert y.shape == (B, Hkv, R, D) and y.dtype == dtype, case
    assert rel_err(y, ref) < tol, (case, rel_err(y, ref))
    torch.testing.assert_close(kc[:, :, pos], kc_ref[:, :, pos], rtol=1e-2, atol=1e-2)  # RoPE'd: rounding
    assert torch.equal(vc[:, :, pos], vc_ref[:, :, pos]), case
    others = torch.arange(rows, device=device) != pos
    for got, want in ((kc, kc_ref), (vc, vc_ref)):  # nothing else written (NaN stays NaN)
        assert torch.equal(got[:, :, others].nan_to_num(7.0), want[:, :, others].nan_to_num(7.0)), case


def check_slot_case(Hkv, R, D, W, lens, rows, *, dtype=torch.bfloat16, device="cuda", tol=1e-2, seed=0):
    """A SlotKVCache's decode view of its first `rows` slots over W keys, the slots at lengths
    `lens` (0: a free slot): `rope_attend` (the fused op, a position per slot) against its
    unfused twin (begin_step's rows of the tables, apply_rope, update's index_put_ at each
    length, window_attention over begin_step's mask), and the same in float64. The fused op's
    caches hold NaN from each slot's length on (never read: the op writes the new key and value
    at the length itself); the result is finite and equal, and afterwards the caches differ
    from the twin's only at each slot's length, by rounding, still hold NaN past it, and the
    slots past `rows` are untouched."""
    from tinyllm.kv_cache import SlotKVCache
    from tinyllm.model import Rope, apply_rope

    S, B = len(lens), rows
    g = torch.Generator(device="cpu").manual_seed(seed)
    cache = SlotKVCache(1, S, W + 36, device)  # cache rows W + 37: keys past the window too
    kc = torch.randn(S, Hkv, cache.rows, D, generator=g).to(device, dtype)
    vc = torch.randn(S, Hkv, cache.rows, D, generator=g).to(device, dtype)
    qkv = torch.randn(B, (R + 2) * Hkv * D, generator=g).to(device, dtype)
    rope = Rope(D, max(4096, cache.rows), 10000.0, device)
    cache._lens_dev.copy_(torch.tensor(lens))
    scale = D ** -0.5

    cache.k[0], cache.v[0] = kc.clone(), vc.clone()  # the twin's caches
    view = cache.decode(W, B)
    cos, sin = view.begin_step(1, rope)  # (B, 1, D/2): each slot's row
    q, k, v = qkv[:, None].split([R * Hkv * D, Hkv * D, Hkv * D], dim=-1)  # (B, 1, n) each
    q = apply_rope(q.view(B, 1, Hkv * R, D).transpose(1, 2), cos, sin).view(B, Hkv, R, D)
    k = apply_rope(k.view(B, 1, Hkv, D).transpose(1, 2), cos, sin)  # (B, Hkv, 1, D)
    v = v.view(B, 1, Hkv, D).transpose(1, 2)
    k_win, v_win = view.update(0, k, v)  # (B, Hkv, W, D), written at each slot's length
    mask = view.attn_kwargs["attn_mask"]  # (B, 1, 1, W)
    slow = window_attention(q, k_win, v_win, mask, scale)
    ref = window_attention(q.double(), k_win.double(), v_win.double(), mask, scale)
    kc_ref, vc_ref = cache.k[0], cache.v[0]

    for s, n in enumerate(lens):  # what the fused op never reads, and the position it writes
        kc[s, :, n:], vc[s, :, n:] = float("nan"), float("nan")
    before = kc.clone(), vc.clone()
    cache.k[0], cache.v[0] = kc, vc
    view = cache.decode(W, B)
    view.begin_step(1, rope)
    y = view.rope_attend(0, qkv, cos, sin, scale)  # (B, Hkv, R, D); writes kc, vc at each length
    case = (Hkv, R, D, W, lens, rows)
    assert y is not None and y.shape == (B, Hkv, R, D) and y.dtype == dtype, case
    assert torch.isfinite(y).all() and rel_err(y, ref) < tol, (case, rel_err(y, ref))
    assert rel_err(y, slow.double()) < 1.5e-2, (case, rel_err(y, slow.double()))
    at, pos = torch.arange(B, device=device), torch.tensor(lens[:B], device=device)
    torch.testing.assert_close(kc[at, :, pos], kc_ref[at, :, pos], rtol=1e-2, atol=1e-2)  # RoPE'd: rounding
    assert torch.equal(vc[at, :, pos], vc_ref[at, :, pos]), case
    for s, n in enumerate(lens[:B]):  # nothing else written: the keys before the length as they were, NaN past it
        for got, want in ((kc, kc_ref), (vc, vc_ref)):
            assert torch.equal(got[s, :, :n], want[s, :, :n]) and got[s, :, n + 1:].isnan().all(), (case, s)
    for got, old in zip((kc, vc), before, strict=True):  # the slots past `rows`: not the step's
        assert torch.equal(got[B:].nan_to_num(7.0), old[B:].nan_to_num(7.0)), case


# Slot caches (Hkv, R, D, W, lens, rows): free slots (0), lengths at block edges (63, 64, 127,
# W - 1), a window much longer than most slots, 35 splits (the combine loops twice), a step over
# the first rows of the cache only; W <= 128 is one tile a head at the default TILE, the longer
# windows split and combined.
SLOT_CASES = [
    (2, 3, 64, 1024, [0, 5, 0, 130, 64, 63, 1023, 0], 8),
    (2, 8, 128, 128, [0, 127, 3, 0, 64, 90, 0, 12], 4),
    (1, 1, 32, 256, [200, 0, 1], 3),
    (4, 4, 64, 2200, [0, 17, 0, 2150, 0, 1, 40, 0], 6),
]


def check_compiled_rope_in_place(device="cuda", dtype=torch.bfloat16):
    """rope_decode_attention in an Inductor-compiled step (dynamic shapes): the op is handed the
    cache inputs themselves, so it writes them in place. Were they taken as needing a copy, the
    step would clone each cache and copy it back, every layer."""
    from torch._inductor.utils import run_and_get_code

    B, Hkv, R, D, rows, W, pos = 2, 2, 3, 64, 300, 256, 200
    g = torch.Generator(device="cpu").manual_seed(3)
    qkv = torch.randn(B, (R + 2) * Hkv * D, generator=g).to(device, dtype)
    kc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    vc = torch.randn(B, Hkv, rows, D, generator=g).to(device, dtype)
    cos, sin = torch.rand(rows, D // 2, device=device), torch.rand(rows, D // 2, device=device)
    p, fv = torch.tensor([pos], device=device), torch.tensor([0, 9], device=device)

    def step(qkv, kc, vc, cos, sin, p, fv):
        return da.rope_decode_attention(qkv * 1.0, cos, sin, p, fv, kc, vc, W, D ** -0.5).float() * 2.0

    kc2, vc2 = kc.clone(), vc.clone()
    want = step(qkv, kc2, vc2, cos, sin, p, fv)
    got, codes = run_and_get_code(torch.compile(step, fullgraph=True, dynamic=True), qkv, kc, vc, cos, sin, p, fv)
    code = "\n".join(codes)
    assert "rope_decode_attention.default(" in code and "copy_(" not in code and "clone" not in code, code
    assert torch.equal(got, want) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert not torch.equal(kc[:, :, pos], qkv.new_zeros(())) and torch.isfinite(kc).all()


# -- CUDA -----------------------------------------------------------------------------------

cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("W", [128, 256, 1000, 2048])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("tile", [None, 0])
def test_against_window_attention_and_float64(W, D, tile, monkeypatch):
    """tile: the default (W = 128 one tile a head, the longer windows split and combined), or 0:
    every window split and combined."""
    from tinyllm.kernels import decode_attention_triton as T

    if tile is not None:
        monkeypatch.setattr(T, "TILE", tile)
    for B in (1, 2):
        for Hkv in (1, 3, 4):
            for R in (1, 3, 8):
                q, k, v = make_case(B, Hkv, R, D, W, seed=W + D + B + Hkv + R)  # k, v: slices of a cache
                assert da.supported(q, k, v, window_mask(W, [0] * B, [0] * B))
                for fv, pos in masks_for(B, W):
                    mask = window_mask(W, fv, pos)
                    scale = D ** -0.5
                    y = da.decode_attention(q, k, v, mask, scale)  # (B, Hkv, R, D)
                    assert y.shape == (B, Hkv, R, D) and y.dtype == v.dtype
                    ref = window_attention(q.double(), k.double(), v.double(), mask, scale)
                    slow = window_attention(q, k, v, mask, scale)
                    case = (B, Hkv, R, D, W, fv, pos)
                    assert rel_err(y, ref) < 1e-2, case
                    assert rel_err(y, slow.double()) < 1.5e-2, case
                    assert rel_err(slow, ref) < 1.5e-2, case  # the reference itself, for scale


@cuda
@pytest.mark.parametrize("D", [32, 64, 128])
def test_rope_decode_attention_against_its_twin(D):
    for B, Hkv, R, W, first_valid, pos in [(1, 4, 8, 128, [0], 0), (1, 4, 8, 1024, [0], 700), (2, 3, 3, 200, [0, 70], 150),
                                           (2, 2, 1, 2048, [5, 0], 2047), (1, 1, 3, 128, [0], 64)]:
        check_rope_case(B, Hkv, R, D, W, first_valid, pos, seed=D + W)


@cuda
@torch.no_grad()
def test_compiled_rope_attention_writes_the_cache_in_place():
    check_compiled_rope_in_place()


@cuda
def test_masked_keys_are_never_read_and_an_empty_row_is_zero():
    B, Hkv, R, D, W = 2, 3, 3, 64, 300
    q, k, v = make_case(B, Hkv, R, D, W)
    mask = window_mask(W, [10, 0], [200, 0])
    ref = window_attention(q.double(), k.double(), v.double(), mask, D ** -0.5)
    k[:, :, 201:], v[:, :, 201:] = float("nan"), float("nan")  # the cache past pos: garbage
    k[0, :, :10], v[0, :, :10] = float("nan"), float("nan")  # and before first_valid
    y = da.decode_attention(q, k, v, mask, D ** -0.5)
    assert rel_err(y, ref) < 1e-2
    mask[1] = False  # no key at all: the caller never does this, and gets 0
    y = da.decode_attention(q, k, v, mask, D ** -0.5)
    assert torch.isfinite(y).all() and (y[1] == 0).all()


@cuda
def test_compiled_dynamic_matches_eager_and_replays_in_a_graph():
    B, Hkv, R, D, rows = 2, 3, 3, 64, 2100
    scale = D ** -0.5

    def step(q, kc, vc, mask):  # as the decode step: slice the cache to the window in-graph
        W = mask.shape[-1]
        y = da.decode_attention(q * 1.0, kc[:, :, :W], vc[:, :, :W], mask, scale)
        return y.float() * 2.0  # some work for Inductor to fuse around the op

    fn = torch.compile(step, fullgraph=True, dynamic=True)
    q, kc, vc = make_case(B, Hkv, R, D, rows, rows=rows)
    for i, W in enumerate((128, 256, 1000, 2048)):
        mask = window_mask(W, [0, 5], [W - 1, W // 2])
        want = step(q, kc, vc, mask)
        if i == 0:
            got = fn(q, kc, vc, mask)
        else:
            with torch._dynamo.config.patch(error_on_recompile=True):  # one compile, every W
                got = fn(q, kc, vc, mask)
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)

    # Capture the eager op and the compiled step; change the inputs in place; replay.
    W = 1000
    mask = window_mask(W, [0, 0], [500, 900])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up off the capture
            step(q, kc, vc, mask), fn(q, kc, vc, mask)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_eager = step(q, kc, vc, mask)
        out_compiled = fn(q, kc, vc, mask)
    q2, kc2, vc2 = make_case(B, Hkv, R, D, rows, rows=rows, seed=1)
    q.copy_(q2), kc.copy_(kc2), vc.copy_(vc2)
    mask.copy_(window_mask(W, [3, 100], [W - 1, 600]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_eager, step(q, kc, vc, mask))
    assert torch.equal(out_compiled, fn(q, kc, vc, mask))
    ref = window_attention(q.double(), kc[:, :, :W].double(), vc[:, :, :W].double(), mask, scale)
    assert rel_err(out_eager / 2, ref) < 1e-2


@cuda
@torch.no_grad()
def test_compiled_graph_reads_the_cache_in_place():
    """The op mutates none of its inputs, and the graph passes it views of the cache: were k,
    v or the mask taken as mutated (or needing another layout), the graph would clone the
    cache slice, and write it back (slice_scatter), in every layer."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(q, kc, vc, mask):
        W = mask.shape[-1]
        return da.decode_attention(q, kc[:, :, :W], vc[:, :, :W], mask, 0.125)

    q, kc, vc = make_case(2, 3, 3, 64, 1100, rows=1100)
    mask = window_mask(1000, [0, 0], [999, 500])
    fn = torch.compile(step, backend=aot_autograd(fw_compiler=keep), fullgraph=True, dynamic=True)
    torch.testing.assert_close(fn(q, kc, vc, mask), step(q, kc, vc, mask), rtol=0, atol=0)
    nodes = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert not [n for n in nodes if "scatter" in str(n.target) or "copy" in str(n.target)], graphs[0].code
    calls = [n for n in nodes if n.target is torch.ops.tinyllm.decode_attention.default]
    assert len(calls) == 1, graphs[0].code
    for arg in calls[0].args[1:3]:  # k and v: slices of the cache inputs, read in place
        assert "slice" in str(arg.target), graphs[0].code
        while "slice" in str(arg.target):
            arg = arg.args[0]
        assert arg.op == "placeholder", graphs[0].code


@cuda
@torch.no_grad()
def test_model_decode_with_the_kernel_matches_window_attention(monkeypatch):
    """The model's compiled static decode step on CUDA (bf16) goes through the fused kernel, the
    reference ops' step through window_attention, and their logits agree to bf16 rounding. Both
    are fed the reference's greedy tokens, so the two compare one text (a near-tie of two
    free-running decodes would part them)."""
    from tinyllm.core.ops import CudaOps, Ops
    from tinyllm.cuda_graph import GraphDecoder
    from tinyllm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", vocab_size=1024, dim=192, n_layers=3, n_heads=6,
                                n_kv_heads=2, ffn_dim=512, max_seq_len=1024)  # D = 32, R = 3
    model = Transformer(cfg).init_weights(0).to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(0, 1024, (2, 150), device="cuda")
    calls = []
    for name in ("decode_attention", "rope_decode_attention"):  # the static cache's step takes the fused one
        real = getattr(da, name)
        monkeypatch.setattr(da, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))

    def run(compile: str | None, ops, feed: list[torch.Tensor] | None = None):
        model.ops = ops
        dec = GraphDecoder(model, 2, max_len=1024, use_graph=False, compile=compile)
        logits, outs, fed = dec.prefill(prompt), [], []
        for i in range(40):
            fed.append(logits[:, -1].argmax(-1, keepdim=True) if feed is None else feed[i])  # (2, 1)
            logits = dec.step(fed[-1])
            outs.append(logits.float())
        return torch.cat(outs, 1), fed

    slow, fed = run(None, Ops())  # the reference ops: window_attention (the plain CUDA step fuses it too)
    assert not calls
    fast, _ = run("eager", CudaOps(), fed)  # Dynamo traces the step (each layer calls the fused op), no Inductor
    assert len(calls) >= cfg.n_layers and set(calls) == {"rope_decode_attention"}
    assert ((fast - slow).norm() / slow.norm()).item() < 2e-2


@cuda
@pytest.mark.parametrize("tile", [None, 0, 4096])
def test_slot_rope_attention_against_its_twin(tile, monkeypatch):
    """A position per slot: tile None (the default: W = 128 one tile a head, longer windows
    split), 0 (every window split and combined), 4096 (every window one program a head, which
    walks the windows past 128 keys in blocks of 128: loaded whole, a tile of 4,096 keys asked
    the H200 for 690,176 bytes of shared memory and did not launch)."""
    from tinyllm.kernels import decode_attention_triton as T

    if tile is not None:
        monkeypatch.setattr(T, "TILE", tile)
    for i, case in enumerate(SLOT_CASES):
        check_slot_case(*case, seed=i)


def tiny_slot_model(device="cuda", dtype=torch.bfloat16):
    from tinyllm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", vocab_size=1024, dim=192, n_layers=3, n_heads=6,
                                n_kv_heads=2, ffn_dim=512, max_seq_len=1024)  # D = 32, R = 3
    return Transformer(cfg).init_weights(0).to(device, dtype).eval()


@torch.no_grad()
def check_compiled_slot_step(steps, device="cuda", dtype=torch.bfloat16):
    """The compiled slot step (the fused op, a position per slot) against the plain step
    (index_put_ and window_attention over the mask), fed the same tokens: the live slots'
    logits agree to 16-bit rounding at every step; the compiled step calls the fused op. 16
    slots, the live ones among the first 8: each step runs the row bucket of 8."""
    from torch._inductor.utils import run_and_get_code

    from tinyllm.cuda_graph import SlotGraphDecoder
    from tinyllm.decode.sampling import SamplingParams
    from tinyllm.kv_cache import SlotKVCache

    model = tiny_slot_model(device, dtype)
    g = torch.Generator().manual_seed(1)
    live = {1: 5, 3: 100, 4: 64, 6: 230}  # slot -> prompt length; slots 0, 2, 5, 7 stay free
    prompts = {s: torch.randint(0, 1024, (n,), generator=g).tolist() for s, n in live.items()}
    toks = torch.randint(0, 1024, (steps, 16, 1), generator=g).to(device)  # (steps, S, 1)

    def run(compile: str | None) -> torch.Tensor:
        slots = SlotKVCache(model.cfg.n_layers, 16, 1024, device)
        dec = SlotGraphDecoder(model, slots, use_graph=False, compile=compile)  # row buckets 8, 16
        for s, ids in prompts.items():
            slots.start_prefill([s], [len(ids)])
            logits, _ = model(torch.tensor([ids], device=device), cache=slots, last_only=True)  # (1, 1, V)
            slots.admit([s])
            dec.start_rows(slots._prefill_rows, logits[:, -1], [SamplingParams(max_tokens=1000)], [0], [ids], [[]])
        out = torch.stack([dec.step(t)[:, -1].float() for t in toks])  # (steps, B, V)
        assert dec.rows == 8, dec.rows
        return out

    slow = run(None)
    fast, codes = run_and_get_code(run, "inductor")
    assert "rope_decode_attention" in "\n".join(codes)
    rows = sorted(live)
    for i in range(steps):
        assert rel_err(fast[i, rows], slow[i, rows].double()) < 2e-2, i


@torch.no_grad()
def check_fused_slot_step_in_place(device="cuda", dtype=torch.bfloat16):
    """The compiled slot step with the fused op, static shapes (sizes are literals in its code),
    the row bucket of 8 of 16 slots: no buffer has the cache's length (max_len + 1 = 77
    positions, a size nothing else has), so the op writes the whole caches in place, with no
    cache-sized temporary and no copy back, and every layer's cache changes."""
    import re

    from torch._inductor.utils import run_and_get_code

    from tinyllm.cuda_graph import SlotGraphDecoder
    from tinyllm.decode.sampling import SamplingParams
    from tinyllm.kv_cache import SlotKVCache

    model = tiny_slot_model(device, dtype)
    slots = SlotKVCache(model.cfg.n_layers, 16, 76, device)
    dec = SlotGraphDecoder(model, slots, buckets=(32, 76), use_graph=False)
    for s, n in ((1, 5), (6, 9)):
        ids = list(range(3, 3 + n))
        slots.start_prefill([s], [n])
        logits, _ = model(torch.tensor([ids], device=device), cache=slots, last_only=True)  # (1, 1, V)
        slots.admit([s])
        dec.start_rows(slots._prefill_rows, logits[:, -1], [SamplingParams(max_tokens=8)], [0], [ids], [[]])
    before = [t.clone() for t in slots.k]
    _, codes = run_and_get_code(torch.compile(dec.plain_step, fullgraph=True, dynamic=False), 32, 8)
    code = "\n".join(codes)
    allocs = re.findall(r"empty_strided_\w+\(\(([^)]*)\)", code)
    assert "rope_decode_attention" in code and allocs, code
    assert all(str(slots.rows) not in re.split(r"[ ,]+", a) for a in allocs), allocs
    assert all(not torch.equal(a, b) for a, b in zip(before, slots.k, strict=True))


@cuda
def test_compiled_slot_step_writes_the_whole_caches_in_place():
    check_fused_slot_step_in_place()


@cuda
@torch.no_grad()
def test_compiled_engine_step_takes_the_fused_op_and_equals_its_eager_twin():
    """Engine(n_slots=8, compile="inductor"): its compiled step calls rope_decode_attention in
    every layer (a position per slot) and never the masked op, and replaying it in graphs gives
    the same greedy tokens as running it eagerly, bit for bit, with slots joining, finishing
    and standing free, over row buckets of 4 and 8 slots."""
    from torch._inductor.utils import run_and_get_code

    from tinyllm.decode.engine import Engine
    from tinyllm.decode.sampling import SamplingParams

    model = tiny_slot_model()
    g = torch.Generator().manual_seed(0)
    lens = (3, 200, 40, 1, 500, 25, 130, 60, 11, 300)
    reqs = [(4 * i if i % 3 else 0, torch.randint(0, 1024, (n,), generator=g).tolist(),
             SamplingParams(max_tokens=20 + 13 * i)) for i, n in enumerate(lens)]

    def run(use_graph: bool) -> list[list[int]]:
        engine = Engine(model, 8, max_len=1024, use_graph=use_graph, compile="inductor", row_buckets=(4, 8))
        ids, i = {}, 0
        while len(ids) < len(reqs) or engine.has_work:
            for j, (at, prompt, params) in enumerate(reqs):
                if at == i:
                    ids[j] = engine.add_request(prompt, params)
            engine.step()
            i += 1
        return [engine.result(ids[j]) for j in range(len(reqs))]

    eager, codes = run_and_get_code(run, False)
    code = "\n".join(codes)
    n_fused = code.count("rope_decode_attention.default(")
    assert n_fused >= model.cfg.n_layers and n_fused % model.cfg.n_layers == 0, code
    assert "tinyllm.decode_attention.default(" not in code, code  # the masked op: not in a slot step
    assert run(True) == eager
    assert all(len(toks) == params.max_tokens for toks, (_, _, params) in zip(eager, reqs, strict=True))


@cuda
def test_compiled_slot_step_with_the_fused_op_matches_the_plain_step():
    check_compiled_slot_step(60)  # windows of 256, then 512 keys


# -- CPU -------------------------------------------------------------------------------------

@torch.no_grad()
def test_slot_decode_hands_the_fused_op_each_slots_length(monkeypatch):
    """_SlotDecode.rope_attend's call, without Triton: the first B slots' device lengths as
    positions (each slot writes at its own), zeros held once by the cache as first_valid, the
    whole tables and the layer's whole caches, and the window; None where the op can't take
    the inputs (a CPU's, here) or before the layer's K/V exist."""
    from tinyllm.kv_cache import SlotKVCache
    from tinyllm.model import Rope

    S, Hkv, R, D, W = 8, 2, 3, 16, 32
    cache = SlotKVCache(n_layers=2, n_slots=S, max_len=64)
    cache.ensure(0, torch.zeros(S, Hkv, 1, D))
    cache._lens_dev.copy_(torch.tensor([0, 7, 0, 31, 2, 0, 0, 5]))
    rope = Rope(D, 128, 10000.0)
    view = cache.decode(W)
    cos, sin = view.begin_step(1, rope)
    qkv = torch.randn(S, (R + 2) * Hkv * D)
    assert view.rope_attend(0, qkv, cos, sin, 0.25) is None  # a CPU: the op takes CUDA tensors only

    calls = []
    monkeypatch.setattr(da, "rope_supported", lambda qkv, k, v: True)
    monkeypatch.setattr(da, "rope_decode_attention", lambda *a: calls.append(a) or a[0].new_zeros(len(a[0]), Hkv, R, D))
    assert view.rope_attend(1, qkv, cos, sin, 0.25) is None and not calls  # layer 1 unallocated: the plain path
    for B in (S, 4):  # two steps' views: every slot, then the first 4
        view = cache.decode(W, B)
        cos, sin = view.begin_step(1, rope)
        assert view.rope_attend(0, qkv[:B], cos, sin, 0.25).shape == (B, Hkv, R, D)
    for (x, cos1, sin1, pos, fv, k, v, w, scale, sliding, cap, norms), B in zip(calls, (S, 4), strict=True):
        assert x.shape[0] == B and cos1 is rope.cos and sin1 is rope.sin and (w, scale, sliding, cap) == (W, 0.25, 0, 0.0)
        assert norms is None  # no per-head q/k norm asked for
        assert k is cache.k[0] and v is cache.v[0]  # the whole caches: the op uses their first B rows
        assert pos.tolist() == [0, 7, 0, 31, 2, 0, 0, 5][:B] and pos.data_ptr() == cache._lens_dev.data_ptr()
        assert fv.tolist() == [0] * B and fv.dtype == torch.long
        assert fv.data_ptr() == cache._first_valid.data_ptr()  # held by the cache, not made per step


# -- CPU, Triton's interpreter ----------------------------------------------------------------

INTERPRETED = textwrap.dedent("""
    import os
    import torch
    from tinyllm.kernels import decode_attention_triton as T
    from tinyllm.core.ops import window_attention
    from tests.tinyllm.test_decode_attention import make_case, window_mask, rel_err

    run = T.decode_attention  # the op launches its kernels itself: the interpreter runs them
    cases = [  # B, Hkv, R, D, W, first_valid, pos
        (2, 3, 3, 64, 200, [0, 70], [199, 150]),  # W not a multiple of 64; a fully masked block
        (1, 1, 1, 32, 64, [0], [0]),  # one key
        (2, 2, 8, 128, 130, [129, 0], [129, 64]),  # the last key only
        (1, 1, 3, 64, 2200, [0], [2150]),  # 35 splits: the combine loops twice
    ]
    from tests.tinyllm.test_decode_attention import check_rope_case
    for tile in (0, 4096):  # split and combined at every window; then one tile a head at every window
        T.TILE = tile
        for B, Hkv, R, D, W, fv, pos in cases:
            q, k, v = make_case(B, Hkv, R, D, W, dtype=torch.float16, device="cpu", seed=W)
            mask = window_mask(W, fv, pos, device="cpu")
            ref = window_attention(q.double(), k.double(), v.double(), mask, D ** -0.5)
            for b in range(B):  # keys outside the window are never read: NaN there changes nothing
                for x in (k, v):
                    x[b, :, pos[b] + 1:], x[b, :, :fv[b]] = float("nan"), float("nan")
            y = run(q, k, v, mask, D ** -0.5)
            assert y.shape == (B, Hkv, R, D) and y.dtype == torch.float16
            assert rel_err(y, ref) < 2e-3, (B, Hkv, R, D, W, rel_err(y, ref))
        mask = window_mask(64, [0], [10], device="cpu")
        mask[:] = False  # no key at all: 0, not NaN
        q, k, v = make_case(1, 1, 3, 64, 64, dtype=torch.float16, device="cpu")
        assert (run(q, k, v, mask, 0.125) == 0).all()

        for case in [  # B, Hkv, R, D, W, first_valid, pos (one position for all rows: a static cache)
            (2, 3, 3, 64, 200, [0, 70], 150),  # pos inside the third block
            (1, 1, 1, 32, 64, [0], 0),  # the first step: one key, the new one
            (2, 2, 8, 128, 130, [0, 5], 129),  # pos the window's last key, alone in its block
            (1, 2, 4, 64, 2200, [0], 2150),  # 35 splits
        ]:
            check_rope_case(*case, dtype=torch.float16, device="cpu", tol=2e-3)
        # The families' kernels: heads of 256 dims (Gemma), soft-capped scores (Gemma 2), sliding windows
        for B, Hkv, R, D, W, fv, pos, cap in [(2, 1, 4, 256, 150, [0, 9], [149, 100], 0.0),
                                              (1, 2, 3, 64, 200, [0], [180], 1.5), (1, 1, 2, 256, 90, [0], [89], 2.0)]:
            q, k, v = make_case(B, Hkv, R, D, W, dtype=torch.float16, device="cpu", seed=W)
            q = q * 3  # scores of a few units: the cap bends them
            mask = window_mask(W, fv, pos, device="cpu")
            ref = window_attention(q.double(), k.double(), v.double(), mask, D ** -0.5, cap)
            y = run(q, k, v, mask, D ** -0.5, cap)
            assert rel_err(y, ref) < 2e-3, (D, W, cap, rel_err(y, ref))
            if cap:
                assert rel_err(y, window_attention(q.double(), k.double(), v.double(), mask, D ** -0.5)) > 1e-2
        for case, sliding, cap in [((2, 2, 4, 64, 300, [0, 3], 250), 70, 2.0), ((1, 1, 4, 256, 130, [0], 129), 40, 0.0),
                                   ((1, 1, 2, 32, 64, [0], 10), 64, 1.0)]:
            check_rope_case(*case, dtype=torch.float16, device="cpu", tol=2e-3, sliding=sliding, cap=cap)
    from tests.tinyllm.test_decode_attention import check_compiled_rope_in_place
    check_compiled_rope_in_place("cpu", torch.float16)
    print("ok")
""")


SLOT_INTERPRETED = textwrap.dedent("""
    import numpy as np
    import torch
    from triton.runtime import interpreter
    from tinyllm.kernels import decode_attention as da
    from tinyllm.kernels import decode_attention_triton as T
    from tests.tinyllm.test_decode_attention import SLOT_CASES, check_slot_case

    da.rope_supported = lambda qkv, k, v: True  # the view's check wants CUDA tensors; these are a CPU's
    for tile in (0, 128, 4096):  # every window split; the default; every window one tile a head
        T.TILE = tile
        for i, case in enumerate(SLOT_CASES):
            check_slot_case(*case, dtype=torch.float16, device="cpu", tol=2e-3, seed=i)

    # What the fused op reads of the caches, and how many blocks each program walks: the
    # interpreter's loads (addresses where the mask holds) and products, spied on.
    builder, loads, dots = interpreter.interpreter_builder, [], [0]
    real_load, real_dot = builder.create_masked_load, builder.create_dot
    def load(ptrs, mask, *args):
        loads.append(ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.int64))
        return real_load(ptrs, mask, *args)
    def dot(*args):
        dots[0] += 1
        return real_dot(*args)
    builder.create_masked_load, builder.create_dot = load, dot
    for tile in (0, 4096):
        T.TILE = tile
        for Hkv, R, D, W, lens, B in SLOT_CASES:  # a step over the first B of S slots
            S, rows = len(lens), W + 37
            g = torch.Generator().manual_seed(W)
            qkv = torch.randn(B, (R + 2) * Hkv * D, generator=g).half()
            kc, vc = torch.randn(2, S, Hkv, rows, D, generator=g).half()
            rope = torch.rand(rows, D // 2)
            loads.clear()
            dots[0] = 0
            da.rope_decode_attention(qkv, rope, rope, torch.tensor(lens[:B]), torch.zeros(B, dtype=torch.long),
                                     kc, vc, W, D ** -0.5)
            got = np.concatenate(loads)
            for cache in (kc, vc):
                at = got[(got >= cache.data_ptr()) & (got < cache.data_ptr() + cache.nbytes)] - cache.data_ptr()
                slot, key = at // (Hkv * rows * D * 2), at // (D * 2) % rows
                assert len(at) and (slot < B).all(), (tile, W, lens, B)
                assert (key < torch.tensor(lens).numpy()[slot]).all(), (tile, W, lens, B)
            walked = [n // T.plan(W, D, R)[0] + 1 for n in lens[:B]]  # blocks each head walks: up to its length
            assert dots[0] == 2 * Hkv * sum(walked), (tile, W, lens, B, dots[0], walked)
    print("ok")
""")


COMPILED_SLOT_INTERPRETED = textwrap.dedent("""
    import torch
    from tinyllm.core import ops
    from tinyllm.kernels import decode_attention as da
    from tests.tinyllm.test_decode_attention import check_compiled_slot_step, check_fused_slot_step_in_place

    # A CPU's ops and the op's check take the fused op as CUDA's do: the compiled CPU step
    # (Inductor, C++ wrapper) then calls it through the model and the slot cache's decode view.
    da.rope_supported = lambda qkv, k, v: True
    ops.CpuOps.rope_attend = ops.CudaOps.rope_attend
    check_compiled_slot_step(3, "cpu", torch.float16)
    check_fused_slot_step_in_place("cpu", torch.float16)
    print("ok")
""")


def run_interpreted(script: str) -> None:
    """Run `script` in a child with TRITON_INTERPRET=1 (read when Triton is imported), on the
    same path as this process (Triton may lie outside the venv)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    script = "from tests.triton_interpreter import fix_numpy_index\nfix_numpy_index()\n" + textwrap.dedent(script)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    print(r.stdout)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter)")
def test_kernels_under_the_triton_interpreter():
    run_interpreted(INTERPRETED)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter)")
def test_slot_rope_attention_under_the_triton_interpreter():
    """The fused op with a position per slot (SLOT_CASES) against its twin, as the CUDA test;
    and what it reads: no key or value of the caches at or past a slot's length, and each head
    walks the blocks up to its slot's length only (free slots: one block)."""
    run_interpreted(SLOT_INTERPRETED)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter)")
def test_compiled_slot_step_under_the_triton_interpreter():
    """The compiled slot step's fused op through the model, as the CUDA tests, in fp16: 3 steps
    against the plain step, and the caches written in place."""
    run_interpreted(COMPILED_SLOT_INTERPRETED)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                    reason="needs triton; on a CUDA machine the CUDA tests compile them for real")
@pytest.mark.parametrize("D", [32, 64, 128, 256])
def test_kernels_compile_for_the_h200_without_a_gpu(D):
    """Triton's interpreter runs the kernels' arithmetic but not its compiler: compile both for
    sm_90 (PTX and cubin, with the bundled ptxas) to catch what only the compiler refuses."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tinyllm.kernels import decode_attention_triton as T

    target = GPUTarget("cuda", 90, 32)
    types = (["*bf16"] * 3 + ["*i1"] + ["*fp32"] * 3 + ["*bf16"] + ["i32"] * 5 + ["fp32"] * 2 + ["i32"] * 15
             + ["*bf16"] * 2 + ["*fp32"] * 2 + ["*i64"] * 2 + ["i32"] * 3 + ["*bf16"] * 2 + ["fp32"]
             + ["constexpr"] * 8)
    sig = dict(zip(T._split_kernel.arg_names, types, strict=True))
    def split_kernel(block_n=64, new=True, one_pass=False, softcap=False, qk_norm=False):
        # every flag named: Triton's compile cache keys a partial dict of constexprs by its values alone
        flags = {"D": D, "BLOCK_R": 16, "BLOCK_N": block_n, "NEW": new, "ONE_PASS": one_pass, "SOFTCAP": softcap,
                 "QK_NORM": qk_norm, "PDL": True}
        return triton.compile(ASTSource(T._split_kernel, sig, constexprs=flags), target=target)

    fused = split_kernel()
    assert "mma" in fused.asm["ptx"] and fused.asm["cubin"]
    capped = split_kernel(softcap=True)  # Gemma 2's soft-capped scores
    assert "mma" in capped.asm["ptx"] and capped.asm["cubin"]
    normed = split_kernel(qk_norm=True)  # Qwen 3's and Gemma 3's per-head q/k norms
    assert "mma" in normed.asm["ptx"] and normed.asm["cubin"]
    split, one_pass = split_kernel(new=False), split_kernel(one_pass=True)
    tile = split_kernel(block_n=128, one_pass=True)  # a window of 128 keys in one tile
    sig2 = {"m_ptr": "*fp32", "l_ptr": "*fp32", "o_ptr": "*fp32", "out_ptr": "*bf16", "n_split": "i32", "R": "i32",
            "D": "constexpr", "BLOCK_S": "constexpr", "PDL": "constexpr"}
    combine = triton.compile(ASTSource(T._combine_kernel, sig2, constexprs={"D": D, "BLOCK_S": 32, "PDL": True}),
                             target=target)
    assert "mma" in split.asm["ptx"] and split.asm["cubin"] and combine.asm["cubin"]
    assert "mma" in one_pass.asm["ptx"] and one_pass.asm["cubin"] and tile.asm["cubin"]
    for kernel in (split, combine, one_pass, tile):  # PDL: each waits on the kernel before it before any load
        ptx = kernel.asm["ptx"]
        assert "griddepcontrol.wait" in ptx and ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    # Shared memory: the largest blocks a program loads (BLOCK_N split, ONE_PASS_BLOCK in one pass)
    # ask for no more than shared_bytes says (Triton 3.6's rule), which fits Hopper's 232,448 bytes.
    for kernel, block_n in ((fused, 64), (capped, 64), (split, 64), (one_pass, 64), (tile, T.ONE_PASS_BLOCK)):
        assert kernel.metadata.shared <= T.shared_bytes(block_n, 16, D) <= T.SMEM_LIMIT, (D, block_n)
        print(f"D={D} BLOCK_N={block_n}: shared {kernel.metadata.shared} <= {T.shared_bytes(block_n, 16, D)}")
