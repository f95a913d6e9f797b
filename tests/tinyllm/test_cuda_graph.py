"""The static decode step (GraphDecoder with use_graph=False) against the eager KVCache path
on the CPU; its CUDA-graph replay is tested in test_cuda_graph_cuda.py on a GPU."""

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.cuda_graph import GraphDecoder, default_buckets, pick_bucket
from tinyllm.decode.sampling import SamplingParams
from tinyllm.kv_cache import KVCache

TOL = 1e-4


def kv_decode(model, prompt, toks):
    """Logits of the eager KVCache path: prefill prompt (B, T), then feed toks (B, N)."""
    B, T = prompt.shape
    cache = KVCache(model.cfg.n_layers, B, T + toks.shape[1], model.device)
    out = [model(prompt, cache=cache, last_only=True)[0]]
    for i in range(toks.shape[1]):
        out.append(model(toks[:, i:i + 1], cache=cache)[0])
    return torch.cat(out, dim=1)  # (B, N + 1, V)


def test_default_buckets():
    assert default_buckets(1024) == (128, 256, 512, 1024)
    assert default_buckets(1000) == (128, 256, 512, 1000)
    assert default_buckets(128) == (128,)
    assert default_buckets(100) == (100,)


@torch.no_grad()
def test_static_step_equals_kv_cache_decode_across_buckets(model):
    """Decode from 14 to 70 keys with buckets (16, 32, 64, 96): every boundary W-1, W, W+1 is
    crossed, each step uses the smallest bucket holding n + 1 keys, and logits match."""
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 13))
    toks = torch.randint(0, model.cfg.vocab_size, (2, 57))
    dec = GraphDecoder(model, 2, max_len=96, buckets=(16, 32, 64, 96), use_graph=False)
    out = [dec.prefill(prompt)]
    windows = []
    for i in range(toks.shape[1]):
        out.append(dec.step(toks[:, i:i + 1]))
        windows.append((dec.n, dec.window))
    ref = kv_decode(model, prompt, toks)
    assert (torch.cat(out, dim=1) - ref).abs().max() < TOL
    seen = dict(windows)  # positions filled after the step -> bucket it used
    for w in (16, 32, 64):
        assert seen[w - 1] == w and seen[w] == w and seen[w + 1] == pick_bucket((16, 32, 64, 96), w + 1)
    assert seen[w + 1] == 96


@torch.no_grad()
def test_left_padded_rows_equal_unpadded_runs(model):
    a = torch.randint(5, model.cfg.vocab_size, (1, 12))
    b = torch.randint(5, model.cfg.vocab_size, (1, 7))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], dim=1)])  # (2, 12)
    pad_lens = torch.tensor([0, 5])
    toks = torch.randint(0, model.cfg.vocab_size, (2, 40))
    for use_static in (False, True):
        if use_static:
            dec = GraphDecoder(model, 2, max_len=64, buckets=(16, 32, 64), use_graph=False)
            out = [dec.prefill(batch, pad_lens)] + [dec.step(toks[:, i:i + 1]) for i in range(40)]
        else:
            cache = KVCache(model.cfg.n_layers, 2, 64)
            cache.reset(pad_lens)
            out = [model(batch, cache=cache, last_only=True)[0]]
            out += [model(toks[:, i:i + 1], cache=cache)[0] for i in range(40)]
        got = torch.cat(out, dim=1)  # (2, 41, V)
        for row, ids in enumerate((a, b)):
            ref = kv_decode(model, ids, toks[row:row + 1])
            assert (got[row:row + 1] - ref).abs().max() < TOL, (use_static, row)


@torch.no_grad()
def test_truncate_then_decode_equals_fresh_run(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 20))
    toks = torch.randint(0, model.cfg.vocab_size, (1, 10))
    dec = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False)
    dec.prefill(prompt)
    first = [dec.step(toks[:, i:i + 1]).clone() for i in range(10)]
    dec.truncate(20)
    again = [dec.step(toks[:, i:i + 1]) for i in range(10)]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


@torch.no_grad()
def test_decoder_is_reusable_across_requests(model):
    dec = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False)
    p1, p2 = (torch.randint(0, model.cfg.vocab_size, (1, n)) for n in (30, 9))
    dec.prefill(p1)
    for _ in range(5):
        dec.step(torch.ones(1, 1, dtype=torch.long))
    got = dec.prefill(p2)
    assert dec.n == 9
    assert (got - kv_decode(model, p2, torch.zeros(1, 0, dtype=torch.long))).abs().max() < TOL


def test_errors(model):
    dec = GraphDecoder(model, 1, max_len=32, buckets=(32,), use_graph=False)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        GraphDecoder(model, 1, max_len=32, use_graph=True)
    assert not GraphDecoder(model, 1, max_len=32).use_graph  # the default runs where the model is
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        dec.use_graph = True
    with pytest.raises(ValueError, match="expected token ids of shape"):
        dec.prefill(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len 4096 > max_seq_len"):
        GraphDecoder(model, 1, max_len=4096, use_graph=False)
    with pytest.raises(ValueError, match="largest bucket"):
        GraphDecoder(model, 1, max_len=64, buckets=(32,), use_graph=False)
    with pytest.raises(ValueError, match="KV cache full"):
        dec.prefill(torch.zeros(1, 33, dtype=torch.long))
    dec.prefill(torch.zeros(1, 31, dtype=torch.long))
    with pytest.raises(ValueError, match="expected tokens of shape"):
        dec.step(torch.zeros(2, 1, dtype=torch.long))
    dec.step(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="KV cache full"):
        dec.step(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="KV cache full"):
        dec.append(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot truncate"):
        dec.truncate(40)


def test_kv_cache_refuses_wrong_dtype_and_batch():
    model = tiny_model()
    cache = KVCache(model.cfg.n_layers, 1, 16)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache holds torch.float32"):
        model.to(torch.bfloat16)(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    model.float()
    cache.reset()
    with pytest.raises(ValueError, match="batch 2 != cache batch 1"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)


@torch.no_grad()
def test_step_leaves_the_greedy_next_id_in_its_input_buffer(model):
    """After a step, dec.tok holds the argmax of its logits, so step(dec.tok) decodes greedily
    with no copy; the same as passing the argmax in."""
    ids = torch.randint(0, 512, (2, 9))
    a = GraphDecoder(model, 2, max_len=64, buckets=(16, 64), use_graph=False)
    b = GraphDecoder(model, 2, max_len=64, buckets=(16, 64), use_graph=False)
    logits = a.prefill(ids)
    b.prefill(ids)
    b.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
    for _ in range(20):  # crosses W 16 -> 64
        la = a.step(logits[:, -1].argmax(-1, keepdim=True))
        lb = b.step(b.tok)
        assert torch.equal(a.tok, la[:, -1].argmax(-1, keepdim=True))
        assert torch.equal(la, lb) and torch.equal(a.tok, b.tok)
        logits = la


@torch.no_grad()
def test_draw_first_loads_the_settings_and_feeds_the_next_step(model):
    """A reply's first draw, eager, is the one the step would make with the same settings, and
    becomes the next step's input; ids from n_valid on are never drawn."""
    ids = torch.randint(0, 512, (1, 9))
    params = SamplingParams(temperature=0.9, top_k=40, seed=3, repeat_penalty=1.3)
    a = GraphDecoder(model, 1, max_len=64, use_graph=False, n_valid=300)
    b = GraphDecoder(model, 1, max_len=64, use_graph=False, n_valid=300)
    assert a.n_valid == 300 and a.greedy
    logits = a.prefill(ids)[:, -1]  # (1, V)
    b.prefill(ids)
    first = a.draw_first(logits, params, ids)
    b.sampler.load(params, ids)
    assert not a.greedy and torch.equal(first, b.sampler.draw(logits)) and torch.equal(a.tok, first[:, None])
    b.tok.copy_(first[:, None])
    for _ in range(10):
        a.step(a.tok)
        b.step(b.tok)
        assert torch.equal(a.tok, b.tok) and int(a.tok) < 300


def test_run_after_a_prefill_needs_the_first_token_chosen(model):
    """prefill then run(1) would feed a stale token (the first token twice, or another's): refused
    in one line that says what to call; draw_first, step(tok) or a write of tok each choose it."""
    from tinyllm.decode.sampling_params import SamplingParams

    dec = GraphDecoder(model, 1, max_len=32)
    prompt = torch.tensor([[1, 5, 9, 4]])
    logits = dec.prefill(prompt)
    with pytest.raises(ValueError, match="choose the first token before run"):
        dec.run(1)
    first = dec.draw_first(logits[:, -1], SamplingParams(), prompt)
    dec.run(2)
    assert dec.n == 6 and int(first) >= 0
    dec.append(torch.tensor([[7]]))
    with pytest.raises(ValueError, match="draw_first"):
        dec.launch(1)
    dec.tok.fill_(3)  # a token of the caller's own
    dec.run(1)


def test_compile_auto_is_the_native_step_on_a_cpu_where_it_runs(model):
    from tinyllm.decode import cpu_step

    dec = GraphDecoder(model, 1, max_len=32, compile="auto")
    assert dec.compile == ("native" if cpu_step.problem(model, 1) is None else None)
    assert GraphDecoder(model, 1, max_len=32).compile is None  # the plain step unless asked
