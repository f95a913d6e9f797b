"""The continuous batching engine on the CPU (use_graph=False), against one eager
`generate()` per request; the graphed engine is tested in test_engine_cuda.py on a GPU."""

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.decode.engine import Engine, TokenEvent
from tinyllm.decode.generate import generate
from tinyllm.decode.sampling import SamplingParams

BUCKETS = (16, 32, 64, 128)
GREEDY = SamplingParams()


def prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def reference(model, ids, params=GREEDY, stop_ids=(), max_len=128) -> list[int]:
    """One generate() per request, limited as the engine limits it (prompt + reply <= max_len)."""
    n = min(params.max_tokens, max_len - len(ids))
    return [int(t) for t in generate(model, torch.tensor([ids]), n, params, stop_ids)]


def drive(engine, schedule):
    """Step the engine; schedule maps a step index to requests (prompt, params, stop_ids) to add
    before that step. Returns request ids in order and every step's events."""
    ids, steps, i = [], [], 0
    while i <= max(schedule) or engine.has_work:
        for args in schedule.get(i, ()):
            ids.append(engine.add_request(*args))
        steps.append(engine.step())
        i += 1
    return ids, steps


def test_greedy_equals_generate_with_mixed_lengths_joining_and_leaving(model):
    """Nine requests of 1..100 prompt tokens through 4 slots, five of them added while others
    run; every window bucket is crossed, one request fills its slot, one ends on a stop id."""
    lens, max_toks = (3, 17, 40, 1, 90, 25, 8, 60, 100), (20, 35, 10, 50, 30, 5, 40, 25, 50)
    reqs = [(prompt(n, seed), SamplingParams(max_tokens=m), ())
            for seed, (n, m) in enumerate(zip(lens, max_toks, strict=True))]
    stop_ref = reference(model, reqs[7][0], reqs[7][1])
    reqs[7] = (reqs[7][0], reqs[7][1], (stop_ref[12],))  # a stop id the reply reaches
    engine = Engine(model, 4, max_len=128, buckets=BUCKETS)
    ids, steps = drive(engine, {0: reqs[:3], 4: reqs[3:5], 9: reqs[5:6], 30: reqs[6:]})
    for rid, (ids_, params, stops) in zip(ids, reqs, strict=True):
        assert engine.result(rid) == reference(model, ids_, params, stops), rid
        assert engine.is_finished(rid)
    reasons = [engine.finish_reason(r) for r in ids]
    assert reasons[8] == "full" and len(engine.result(ids[8])) == 28
    assert reasons[7] == "stop" and engine.result(ids[7])[-1] == stop_ref[12]
    assert reasons.count("length") == 7
    # the stream of events is each request's reply in order, closed by its finish reason
    for rid in ids:
        evs = [e for step in steps for e in step if e.request_id == rid]
        assert [e.token for e in evs] == engine.result(rid)
        assert [e.finish_reason for e in evs[:-1]] == [None] * (len(evs) - 1)
        assert evs[-1].finish_reason == engine.finish_reason(rid)


def test_finished_slot_is_reused_at_once(model):
    engine = Engine(model, 2, max_len=64, buckets=(32, 64))
    a = engine.add_request(prompt(5, 1), SamplingParams(max_tokens=3))
    b = engine.add_request(prompt(9, 2), SamplingParams(max_tokens=10))
    c = engine.add_request(prompt(4, 3), SamplingParams(max_tokens=4))
    d = engine.add_request(prompt(6, 4), SamplingParams(max_tokens=1))  # finishes on its prefill
    e = engine.add_request(prompt(7, 5), SamplingParams(max_tokens=5))
    first = engine.step()  # prefill a, b (1 token each), one decode (1 more each)
    assert [ev.request_id for ev in first] == [a, b, a, b]
    assert engine.step()[0] == TokenEvent(a, engine.result(a)[-1], "length")
    slot_a = engine.requests[a].slot
    # the very next step: c (first in line) takes a's slot before the decode
    nxt = engine.step()
    assert nxt[0].request_id == c and engine.requests[c].slot == slot_a
    assert engine.slots.active == [True, True]
    engine.run_until_done()
    # d finished on its first token, so e was admitted into the same slot in the same step
    assert engine.requests[d].slot == engine.requests[e].slot
    assert engine.result(d) and engine.finish_reason(d) == "length"
    shapes = ((5, 1, 3), (9, 2, 10), (4, 3, 4), (6, 4, 1), (7, 5, 5))  # prompt length, seed, max_tokens
    for rid, (n, seed, m) in zip((a, b, c, d, e), shapes, strict=True):
        ref = reference(model, prompt(n, seed), SamplingParams(max_tokens=m), max_len=64)
        assert engine.result(rid) == ref, rid


def test_prefill_finish_reuses_slot_within_the_step(model):
    engine = Engine(model, 1, max_len=32, buckets=(32,))
    ids = [engine.add_request(prompt(3, s), SamplingParams(max_tokens=1)) for s in range(3)]
    ids.append(engine.add_request(prompt(3, 9), SamplingParams(max_tokens=2)))
    events = engine.step()  # three one-token requests, then the fourth prefills and decodes
    assert [(e.request_id, e.finish_reason) for e in events] == [
        (ids[0], "length"), (ids[1], "length"), (ids[2], "length"), (ids[3], None), (ids[3], "length")]
    assert not engine.has_work and engine.step() == []


@torch.no_grad()
def test_free_and_dead_slots_never_touch_live_rows():
    """Poison the K/V rows of free and released slots with NaN: live slots' tokens equal an
    unpoisoned run, and their cached rows before each step are unchanged after it."""
    model = tiny_model()
    runs = []
    for poison in (False, True):
        engine = Engine(model, 4, max_len=64, buckets=(16, 32, 64))
        a = engine.add_request(prompt(10, 1), SamplingParams(max_tokens=40))
        b = engine.add_request(prompt(20, 2), SamplingParams(max_tokens=6))  # dies early
        engine.step()
        i = 0
        while engine.has_work:
            live = [s for s in range(4) if engine.slots.active[s]]
            if poison:
                for t in engine.slots.k + engine.slots.v:
                    t[[s for s in range(4) if s not in live]] = float("nan")
            before = [(s, engine.slots.lens[s], [t[s].clone() for t in engine.slots.k + engine.slots.v])
                      for s in live]
            engine.step()
            for s, n, rows in before:
                for old, new in zip(rows, engine.slots.k + engine.slots.v, strict=True):
                    assert torch.equal(old[:, :n], new[s, :, :n]), (i, s)
            i += 1
        runs.append((engine.result(a), engine.result(b)))
        assert engine.is_finished(a) and engine.is_finished(b)
        assert not torch.isnan(engine.slots.k[0][engine.requests[a].slot, :, :49]).any()
    assert runs[0] == runs[1]
    assert runs[0][0] == reference(model, prompt(10, 1), SamplingParams(max_tokens=40), max_len=64)


def test_per_request_sampling_equals_generate_with_the_same_seed(model):
    """Seeded sampling, a repetition penalty and greedy rows side by side: each request draws
    from its own generator and context, as one generate() with its params."""
    params = [SamplingParams(temperature=0.9, top_k=40, seed=7, max_tokens=30),
              SamplingParams(repeat_penalty=1.3, max_tokens=30),
              SamplingParams(max_tokens=30),
              SamplingParams(temperature=1.2, top_p=0.8, repeat_penalty=1.1, seed=3, max_tokens=30)]
    engine = Engine(model, 3, max_len=128, buckets=BUCKETS)
    ids = [engine.add_request(prompt(5 + 7 * i, i), p) for i, p in enumerate(params)]
    engine.run_until_done()
    for i, (rid, p) in enumerate(zip(ids, params, strict=True)):
        assert engine.result(rid) == reference(model, prompt(5 + 7 * i, i), p), i


def test_cancel_frees_the_slot(model):
    engine = Engine(model, 1, max_len=64, buckets=(64,))
    a = engine.add_request(prompt(4, 1), SamplingParams(max_tokens=50))
    b = engine.add_request(prompt(4, 2), SamplingParams(max_tokens=3))
    c = engine.add_request(prompt(4, 3), SamplingParams(max_tokens=3))
    engine.step()
    engine.cancel(a)
    engine.cancel(c)  # still waiting
    assert engine.finish_reason(a) == "cancelled" and len(engine.result(a)) == 2
    engine.run_until_done()
    assert engine.result(c) == [] and engine.finish_reason(c) == "cancelled"
    assert engine.result(b) == reference(model, prompt(4, 2), SamplingParams(max_tokens=3), max_len=64)


def test_errors(model):
    engine = Engine(model, 2, max_len=32, buckets=(32,))
    with pytest.raises(ValueError, match="leaves no room for a reply in max_len 32"):
        engine.add_request(list(range(40)))
    with pytest.raises(ValueError, match="shorten it to at most 31 tokens"):
        engine.add_request(list(range(32)))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([])
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 512\): \[512, -1\]"):
        engine.add_request([1, 512, -1])
    with pytest.raises(ValueError, match="integer token ids"):
        engine.add_request([1.5, 2])
    with pytest.raises(ValueError, match="integer token ids"):
        engine.add_request("hello")
    with pytest.raises(ValueError, match="stop_ids holds ids outside"):
        engine.add_request([1, 2], GREEDY, stop_ids=[100000])
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        engine.add_request([1, 2], {"temperature": 0})
    with pytest.raises(ValueError, match="unknown request id 7"):
        engine.result(7)
    with pytest.raises(ValueError, match="unknown request id"):
        engine.is_finished(0)
    with pytest.raises(ValueError, match="n_slots must be >= 1"):
        Engine(model, 0)
    with pytest.raises(ValueError, match="max_len must be in"):
        Engine(model, 1, max_len=4096)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        Engine(model, 1, max_len=32, use_graph=True)
    assert engine.add_request(torch.tensor([3, 4, 5])) == 0  # a 1-D tensor of ids is fine
    assert len(engine.run_until_done()[0]) == 29  # fills the slot: 3 + 29 = max_len
    assert engine.finish_reason(0) == "full"


def test_admission_prefills_groups_within_the_token_budget(model, monkeypatch):
    """Waiting requests are prefilled together (one right-padded forward per group), at most
    PREFILL_TOKENS padded tokens a group; greedy and penalized replies still equal generate()."""
    import tinyllm.decode.engine as engine_mod

    monkeypatch.setattr(engine_mod, "PREFILL_TOKENS", 64)
    groups = []
    prefill = Engine._prefill
    monkeypatch.setattr(Engine, "_prefill", lambda self, slots, group: (
        groups.append([len(r.prompt) for r in group]), prefill(self, slots, group))[1])
    penalized = SamplingParams(max_tokens=12, repeat_penalty=1.3)
    lens = (50, 10, 30, 5, 70, 20)
    reqs = [(prompt(n, 100 + n), penalized if i % 2 else SamplingParams(max_tokens=12), ())
            for i, n in enumerate(lens)]
    engine = Engine(model, 4, max_len=128, buckets=BUCKETS)
    ids, _ = drive(engine, {0: reqs})
    assert groups[:3] == [[50], [10, 30], [5]]  # 2 x 50 and 3 x 30 padded tokens exceed 64
    assert sorted(n for g in groups for n in g) == sorted(lens)
    for rid, (ids_, params, _) in zip(ids, reqs, strict=True):
        assert engine.result(rid) == reference(model, ids_, params), rid


def test_the_compiled_slot_write_is_in_place():
    """The slot decode step's cache write under Inductor (issue 35, cause 1): each slot's K/V go
    straight into the cache. A scatter_ there compiled to a functional scatter of the whole
    cache into a cache-sized buffer and a copy back, every layer, every step (seen in this
    test's generated code before the fix: `empty_strided_cpu((8, 2, 65, 16)...)` and a
    `copy_`-named kernel writing the cache input)."""
    from torch._inductor.utils import run_and_get_code

    from tinyllm.core.kv_cache import SlotKVCache

    S, H, D, W = 8, 2, 16, 32
    cache = SlotKVCache(n_layers=1, n_slots=S, max_len=64)
    cache.ensure(0, torch.zeros(S, H, 1, D))
    cache._lens_dev.copy_(torch.tensor([0, 3, 9, 31, 5, 0, 17, 30]))
    k, v = torch.randn(S, H, 1, D), torch.randn(S, H, 1, D)

    def step(k, v):
        kk, vv = cache.decode(W).update(0, k, v)  # (S, H, W, D) each
        return (kk * 2).sum() + vv.sum()

    want_k, want_v = cache.k[0].clone(), cache.v[0].clone()
    pos = cache._lens_dev
    want_k[torch.arange(S), :, pos], want_v[torch.arange(S), :, pos] = k[:, :, 0], v[:, :, 0]
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(step, fullgraph=True), k, v)
    code = "\n".join(codes)
    assert torch.equal(cache.k[0], want_k) and torch.equal(cache.v[0], want_v)
    cache_shape = f"({S}, {H}, {cache.rows}, {D})"
    assert f"empty_strided_cpu({cache_shape}" not in code and "copy_" not in code, code
