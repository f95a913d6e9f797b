"""The compact, lazily committed K/V cache on a CPU (tinyllm.kv_cache's kv_dtype and kv_storage)
and the native step over it (tinyllm.decode.cpu_step): a bf16 cache written rounded and read back
in fp32 by the plain step, read directly by the native step; an int8 cache with a scale a head
and position, written quantized by either step and read back within half a step; storage that
costs memory only where positions are written; and the native step against the plain static
step at 4k and 16k keys, fp32, bf16 and int8 caches, on a tiny model with max_seq_len raised.
Two decodes compared step by step read one text (teacher-forced, tests/tinyllm/forced.py)."""

import gc

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_same_draws
from tinyllm.cuda_graph import GraphDecoder, StaticKVCache
from tinyllm.decode import cpu_step
from tinyllm.kernels import cpu_qgemv
from tinyllm.kv_cache import KVCache, SlotKVCache, kv_storage, quantize_int8

native = pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")


def prompt_of(model, n, seed=1):
    return torch.randint(0, model.cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024


@torch.no_grad()
@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_a_bf16_cache_holds_rounded_kv_and_reads_them_back_in_the_querys_dtype(cache_type):
    model = tiny_model(2)
    cfg = model.cfg
    idx = prompt_of(model, 9)
    cache = cache_type(cfg.n_layers, 1, 32, "cpu", kv_dtype=torch.bfloat16)
    logits, _ = model(idx, cache=cache)
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    assert cache.k[0].dtype == torch.bfloat16 and cache.nbytes() == 2 * cfg.n_layers * cache.rows * kv_dim * 2
    full, _ = model(idx)
    torch.testing.assert_close(logits, full, rtol=0, atol=3e-2 * full.abs().max().item())  # bf16 K/V: close, not equal
    more, _ = model(prompt_of(model, 3, 2), cache=cache)  # a second turn appends, reading the bf16 keys as fp32
    assert more.dtype == torch.float32 and cache.n == 12


@torch.no_grad()
@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_an_int8_cache_reads_back_within_half_a_step_of_each_heads_absmax(cache_type):
    """K/V written (a prefill of 7, then 2 more) come back within absmax / 127 / 2 of what was
    written, per (row, head, position): one rounding, the scale fp32."""
    B, H, D = 2, 3, 16
    cache = cache_type(1, B, 16, "cpu", kv_dtype=torch.int8)
    g = torch.Generator().manual_seed(3)
    written = []
    for T in (7, 2):
        cache.begin_step(T, lambda T, start: (torch.zeros(T, D // 2), torch.zeros(T, D // 2)))
        k = torch.randn(B, H, T, D, generator=g) * torch.rand(B, H, T, 1, generator=g) * 10  # (B, H, T, D)
        v = torch.randn(B, H, T, D, generator=g)
        k[0, 1, 0] = 0  # a zero head: scale 0, read back 0
        written.append((k, v))
        got_k, got_v = cache.layer(0).update(k, v)  # (B, H, n + T, D), dequantized
        cache.end_step(T)
    k = torch.cat([w[0] for w in written], 2)
    v = torch.cat([w[1] for w in written], 2)
    assert cache.k[0].dtype == torch.int8 and cache.k_scale[0].shape == (B, H, cache.rows)
    for x, got in ((k, got_k), (v, got_v)):
        bound = x.abs().amax(-1, keepdim=True) / 127 / 2  # (B, H, 9, 1)
        assert got.dtype == torch.float32 and bool(((got - x).abs() <= bound * (1 + 1e-5)).all())
    assert bool((got_k[0, 1, 0] == 0).all())
    assert cache.nbytes() == 2 * cache.rows * B * H * (D + 4)  # int8 K/V and an fp32 scale each


def test_quantize_int8_is_symmetric_absmax_over_127():
    x = torch.tensor([[1.0, -2.54, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_int8(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert q.tolist() == [[50, -127, 25, 0], [0, 0, 0, 0]] and s.tolist() == [torch.tensor(2.54 / 127).item(), 0.0]


@torch.no_grad()
def test_an_int8_cache_serves_the_models_forward():
    model = tiny_model(2)
    idx = prompt_of(model, 9)
    cache = StaticKVCache(model.cfg.n_layers, 1, 32, "cpu", kv_dtype=torch.int8)
    logits, _ = model(idx, cache=cache)
    full, _ = model(idx)
    torch.testing.assert_close(logits, full, rtol=0, atol=3e-2 * full.abs().max().item())  # int8 K/V: close
    more, _ = model(prompt_of(model, 3, 2), cache=cache)
    assert more.dtype == torch.float32 and cache.n == 12


def test_a_slot_cache_refuses_int8():
    with pytest.raises(ValueError, match="int8"):
        SlotKVCache(2, 2, 32, "cpu", kv_dtype=torch.int8)


@torch.no_grad()
def test_a_slot_cache_holds_bf16_too():
    model = tiny_model(2)
    cfg = model.cfg
    slots = SlotKVCache(cfg.n_layers, 2, 32, "cpu", kv_dtype=torch.bfloat16)
    slots.start_prefill([1], [6])
    logits, _ = model(prompt_of(model, 6), cache=slots)
    full, _ = model(prompt_of(model, 6))
    assert slots.k[0].dtype == torch.bfloat16 and slots.lens[1] == 6
    torch.testing.assert_close(logits, full, rtol=0, atol=3e-2 * full.abs().max().item())
    slots.admit([1])
    slots.release(1)
    assert slots.lens[1] == 0 and int(slots._lens_dev[1]) == 0 and int(slots._active_dev[1]) == 0


def test_cpu_storage_costs_memory_only_where_written():
    """A 1 GiB cache: allocating it commits (almost) nothing; writing 128 MiB of it commits about that."""
    gc.collect()
    before = rss_bytes()
    t = kv_storage((1, 8, 2**20, 64), torch.bfloat16, torch.device("cpu"))  # 1 GiB (B, Hkv, rows, D)
    assert t.nbytes == 2**30 and bool((t[0, 7, -4:] == 0).all())
    allocated = rss_bytes()
    assert allocated - before < 32 * 2**20
    t[0, 0, :2**19].fill_(1.0)  # 64 MiB of one head's positions
    t[0, 1, :2**19].fill_(1.0)
    written = rss_bytes()
    assert written - allocated > 120 * 2**20
    del t
    gc.collect()
    assert rss_bytes() < written - 100 * 2**20  # freed with the tensor


@torch.no_grad()
@pytest.mark.parametrize("kv_dtype,mib", [(torch.bfloat16, 128), (torch.int8, 64)])
def test_a_long_cache_costs_memory_for_the_positions_a_prefill_wrote(kv_dtype, mib):
    model = tiny_model(3, max_seq_len=2**17, dim=128, n_kv_heads=4)  # 512 bytes a position a layer, in bf16
    model(prompt_of(model, 64))  # whatever a forward allocates once, before the count
    gc.collect()
    before = rss_bytes()
    cache = StaticKVCache(model.cfg.n_layers, 1, 2**17, "cpu", kv_dtype=kv_dtype)  # 128k positions
    model(prompt_of(model, 64), cache=cache)
    assert cache.nbytes() > mib * 2**20  # (int8: its scales committed lazily too)
    assert rss_bytes() - before < 16 * 2**20


def run_fed(dec, feed):
    """Logits (len(feed), V) and draws of one step per id of feed, step i fed feed[i]."""
    logits, draws = [], []
    for t in feed:
        dec.tok.fill_(t)
        logits.append(dec.run(1)[0, -1].clone())
        draws.append(int(dec.tok))
    return torch.stack(logits), draws


def decode_both(model, prompt, steps, kv_dtype):
    """Logits (steps, V) of the native step, then of the plain static step, from the same prefilled
    cache: the native steps run, the cache rewinds, and the plain steps run the same tokens (the
    last prompt id, then the native step's draws)."""
    dec = GraphDecoder(model, 1, max_len=model.cfg.max_seq_len, use_graph=False)
    dec.cache.kv_dtype = kv_dtype
    cpu_step.use_native(dec, kv_dtype)
    with torch.no_grad():
        dec.prefill(prompt)
        n = dec.n
        runs, feed = [], [int(prompt[0, -1])]
        for step in ("native", "plain"):
            if step == "plain":
                dec.set_compile(None)
            dec.truncate(n)
            dec.tok.copy_(prompt[:, -1:])
            logits = []
            for i in range(steps):
                if step == "plain":
                    dec.tok.fill_(feed[i])
                logits.append(dec.run(1)[0, -1].clone())
                if step == "native":
                    feed.append(int(dec.tok))
            runs.append(torch.stack(logits))
    assert dec.cache.k[0].dtype == kv_dtype
    return runs


@native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_the_native_step_over_a_cache_of_each_dtype_equals_the_plain_step(kv_dtype):
    model = tiny_model(4)
    got, want = decode_both(model, prompt_of(model, 300), 12, kv_dtype)  # keys in two chunks of 256
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@native
def test_the_bf16_cache_is_close_to_fp32_and_picks_the_same_tokens():
    """Fed one text (the fp32 cache's greedy one), the bf16 cache's logits stay within its rounding
    and its draws are fp32's wherever no near-tie can flip them."""
    model = tiny_model(4)
    prompt = prompt_of(model, 40)
    runs, feed = {}, None
    for kv_dtype in (torch.float32, torch.bfloat16):
        dec = GraphDecoder(model, 1, max_len=128, use_graph=False)
        cpu_step.use_native(dec, kv_dtype)
        with torch.no_grad():
            first = dec.prefill(prompt)[0, -1].argmax()
            if feed is None:  # fp32: its own draws, the first from the prefill
                dec.tok.fill_(int(first))
                logits, draws = [], []
                for _ in range(24):
                    logits.append(dec.run(1)[0, -1].clone())
                    draws.append(int(dec.tok))
                runs[kv_dtype] = torch.stack(logits), draws
                feed = [int(first), *draws[:-1]]
            else:
                runs[kv_dtype] = run_fed(dec, feed)
    (want, want_ids), (got, got_ids) = runs[torch.float32], runs[torch.bfloat16]
    torch.testing.assert_close(got, want, rtol=0, atol=2**-8 * want.abs().max().item())  # bf16: 8 bits; seen 2.4e-4
    assert_same_draws(want, want_ids, (got_ids, got))


@native
def test_use_native_holds_a_fresh_cache_in_bf16_by_default_and_keeps_a_filled_one():
    model = tiny_model(4)
    dec = GraphDecoder(model, 1, max_len=64, use_graph=False)
    cpu_step.use_native(dec)
    with torch.no_grad():
        dec.prefill(prompt_of(model, 5))
    assert dec.cache.k[0].dtype == cpu_step.KV_DTYPE == torch.bfloat16
    cpu_step.use_native(dec, torch.float32)  # filled: it keeps its dtype
    dec.tok.fill_(1)
    with torch.no_grad():
        assert dec.run(1).shape == (1, 1, model.cfg.vocab_size)
    assert dec.cache.k[0].dtype == torch.bfloat16


@native
@pytest.mark.parametrize("n_heads,n_kv_heads", [(6, 2), (7, 1), (8, 1)])
def test_the_int8_attention_takes_any_rows_a_head(n_heads, n_kv_heads):
    """Query rows a key/value head of 3, 7 and 8: the int8 scores run up to 3 rows a pass."""
    model = tiny_model(4, n_heads=n_heads, n_kv_heads=n_kv_heads, dim=16 * n_heads)
    got, want = decode_both(model, prompt_of(model, 300), 4, torch.int8)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@native
def test_the_native_step_over_an_int8_cache_draws_the_plain_steps_greedy_ids():
    """Fed the plain step's text, the native step's C++ greedy draws are the plain step's wherever
    no near-tie can flip them."""
    model = tiny_model(4)
    prompt = prompt_of(model, 40)
    runs, feed = {}, None
    for native_step in (False, True):
        dec = GraphDecoder(model, 1, max_len=128, use_graph=False)
        dec.cache.kv_dtype = torch.int8
        if native_step:
            cpu_step.use_native(dec, torch.int8)
        with torch.no_grad():
            dec.prefill(prompt)
            if feed is None:  # the plain step: its greedy draw lands in dec.tok, the next step's input
                dec.tok.copy_(prompt[:, -1:])
                logits, draws = [], []
                for _ in range(40):
                    logits.append(dec.run(1)[0, -1].clone())
                    draws.append(int(dec.tok))
                runs[native_step] = torch.stack(logits), draws
                feed = [int(prompt[0, -1]), *draws[:-1]]
            else:
                runs[native_step] = run_fed(dec, feed)
        assert dec.cache.k[0].dtype == torch.int8
    (want, want_ids), (got, got_ids) = runs[False], runs[True]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_same_draws(want, want_ids, (got_ids, got))
    assert len(set(want_ids)) > 1


@native
@pytest.mark.parametrize("keys", [4096, 16384])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_the_native_step_at_long_windows_equals_the_plain_step(keys, kv_dtype):
    """Prefill keys - 2 positions, then 4 steps across the keys mark: the native step's chunks of
    256 keys split over the pool against the plain step's one masked SDPA over the whole bucket."""
    model = tiny_model(5, max_seq_len=keys + 64)
    got, want = decode_both(model, prompt_of(model, keys - 2), 4, kv_dtype)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.abs().max() > 0.1
