"""The continuous batching engine on the CPU (use_graph=False), against one eager
`generate()` per request; the graphed engine is tested in test_engine_cuda.py on a GPU.

The engine draws its own tokens in its step and cannot be fed another text, and its batched,
masked, bucketed arithmetic is not generate()'s: a reply is generate()'s up to their first
difference, and that one must be a near-tie of generate()'s logits forced along the tokens both
drew (assert_generates; tests/tinyllm/forced.py). Two engines run alike (poisoned free slots,
events on or off) still equal each other token for token."""

from dataclasses import replace

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_parted_only_at_a_near_tie, greedy_scores
from tinyllm.decode.engine import Engine, TokenEvent
from tinyllm.decode.generate import generate
from tinyllm.decode.row_sampler import TOP_K_MAX
from tinyllm.decode.sampling import SamplingParams, apply_repeat_penalty, keep_top, row_noise, sample, seed_key
from tinyllm.decode.step_sampler import REPEAT_WINDOW

BUCKETS = (16, 32, 64, 128)
GREEDY = SamplingParams()
RTOL = 1e-4  # fp32 logits of the engine's step and generate()'s: the static step's tolerance


def prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def reference(model, ids, params=GREEDY, stop_ids=(), max_len=128) -> list[int]:
    """One generate() per request, limited as the engine limits it (prompt + reply <= max_len)."""
    n = min(params.max_tokens, max_len - len(ids))
    return [int(t) for t in generate(model, torch.tensor([ids]), n, params, stop_ids)]


def assert_generates(model, ids, got, params=GREEDY, stop_ids=(), max_len=128, what="") -> None:
    """got, the engine's greedy reply to ids, is reference()'s up to their first difference, and
    there the two part at a near-tie of generate()'s (penalized) logits."""
    want = reference(model, ids, params, stop_ids, max_len)
    assert_parted_only_at_a_near_tie(
        got, want, lambda k: greedy_scores(model, ids, want[:k], RTOL, params.repeat_penalty), what)


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
        assert_generates(model, ids_, engine.result(rid), params, stops, what=rid)
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
    assert [ev.request_id for ev in first] == [a, a, b, b]  # request by request, each in order
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
        assert_generates(model, prompt(n, seed), engine.result(rid), SamplingParams(max_tokens=m), max_len=64, what=rid)


def test_a_request_ending_on_its_first_token_frees_its_slot_at_the_next_step(model):
    """The first token is drawn and checked on the device (no host sync in an admission): the
    host reads that it ended with the chain, and the next request takes the slot a step later."""
    engine = Engine(model, 1, max_len=32, buckets=(32,))
    ids = [engine.add_request(prompt(3, s), SamplingParams(max_tokens=1)) for s in range(3)]
    ids.append(engine.add_request(prompt(3, 9), SamplingParams(max_tokens=2)))
    steps = [[(e.request_id, e.finish_reason) for e in engine.step()] for _ in range(4)]
    assert steps == [[(ids[0], "length")], [(ids[1], "length")], [(ids[2], "length")],
                     [(ids[3], None), (ids[3], "length")]]
    assert not engine.has_work and engine.step() == []
    for rid, s, n in zip(ids, (0, 1, 2, 9), (1, 1, 1, 2), strict=True):
        assert_generates(model, prompt(3, s), engine.result(rid), SamplingParams(max_tokens=n), max_len=32, what=rid)


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
    assert runs[0] == runs[1]  # the same engine's arithmetic on both sides: token for token
    assert_generates(model, prompt(10, 1), runs[0][0], SamplingParams(max_tokens=40), max_len=64)


def row_params(params: SamplingParams) -> SamplingParams:
    """Top-p alone chooses among the TOP_K_MAX likeliest ids, as the engine's does (a nucleus of
    a near-flat distribution is wider)."""
    return replace(params, top_k=TOP_K_MAX) if params.top_k == 0 and params.top_p < 1.0 else params


@torch.no_grad()
def row_reference(model, ids, params, seed, stop_ids=(), max_len=128) -> list[int]:
    """The slow twin of a sampled engine row: a full forward without a cache each token, then
    sample() with the row's noise (its seed, its draw count, every id) and the last
    REPEAT_WINDOW ids of the context for the penalty (row_params' top-k)."""
    params = row_params(params)
    key = torch.tensor([seed_key(seed)])  # (1, 2)
    every = torch.arange(model.cfg.vocab_size)[None]  # (1, V)
    ctx, out = list(ids), []
    while len(out) < params.max_tokens and len(ctx) < max_len:
        logits, _ = model(torch.tensor([ctx]))  # (1, T, V)
        noise = row_noise(key, torch.tensor([len(out)]), every)  # (1, V)
        tok = int(sample(logits[:, -1], params, prev=torch.tensor([ctx[-REPEAT_WINDOW:]]), noise=noise))
        out.append(tok)
        ctx.append(tok)
        if tok in stop_ids:
            break
    return out


@torch.no_grad()
def row_scores(model, ids, params, seed, feed) -> tuple[torch.Tensor, float]:
    """row_reference's draw after ids + feed as scores (V,) whose argmax it is: the penalized
    logits (greedy), else log(probs) - log(noise) (sample()'s probs / noise, -inf where top-k or
    top-p drop an id); and the tolerance RTOL of the logits allows them, through the temperature
    (twice: the softmax's shift moves with them)."""
    params = row_params(params)
    ctx = [*ids, *feed]
    logits = model(torch.tensor([ctx]))[0][:, -1].float()  # (1, V)
    tol = RTOL * max(1.0, logits.abs().max().item())
    if params.repeat_penalty != 1.0:
        logits = apply_repeat_penalty(logits, torch.tensor([ctx[-REPEAT_WINDOW:]]), params.repeat_penalty)
    if params.greedy:
        return logits[0], tol
    x = logits / params.temperature
    if (params.top_k and params.top_k < x.size(-1)) or params.top_p < 1.0:
        x = keep_top(x, torch.tensor([params.top_k]), torch.tensor([params.top_p]))
    noise = row_noise(torch.tensor([seed_key(seed)]), torch.tensor([len(feed)]), torch.arange(x.size(-1))[None])
    return (x.log_softmax(-1) - noise.log())[0], 2 * tol / params.temperature


def assert_draws_as_its_slow_twin(model, ids, got, params, seed, want, what="") -> None:
    """got, an engine row's reply to ids, is want up to their first difference, and there the two
    part at a near-tie of the slow twin's scores (row_scores) forced along the draws both made."""
    assert_parted_only_at_a_near_tie(got, want, lambda k: row_scores(model, ids, params, seed, want[:k]), what)


SAMPLED = [SamplingParams(temperature=0.9, top_k=40, seed=7, max_tokens=30),
           SamplingParams(repeat_penalty=1.3, max_tokens=30),
           SamplingParams(max_tokens=30),
           SamplingParams(temperature=1.2, top_p=0.8, repeat_penalty=1.1, seed=3, max_tokens=30),
           SamplingParams(temperature=0.7, seed=11, max_tokens=30),  # the whole vocabulary
           SamplingParams(temperature=0.5, top_k=50, top_p=0.9, repeat_penalty=1.1, seed=2**64 - 5, max_tokens=30)]


def test_each_sampled_row_draws_as_its_slow_twin(model):
    """Seeded sampling (top-k, top-p, both, the whole vocabulary), a repetition penalty past its
    64-id window and greedy rows side by side: each request draws as a full forward and sample()
    with its own noise and window."""
    engine = Engine(model, 3, max_len=128, buckets=BUCKETS)
    lens = [5 + 17 * i for i in range(len(SAMPLED))]  # up to 90: contexts outgrow the window
    ids = [engine.add_request(prompt(n, i), p) for i, (n, p) in enumerate(zip(lens, SAMPLED, strict=True))]
    engine.run_until_done()
    for i, (rid, p) in enumerate(zip(ids, SAMPLED, strict=True)):
        assert_draws_as_its_slow_twin(model, prompt(lens[i], i), engine.result(rid), p, engine.requests[rid].seed,
                                      row_reference(model, prompt(lens[i], i), p, engine.requests[rid].seed), i)


def test_a_sampled_row_draws_the_same_in_any_batch(model):
    """A seeded request alone in a 1-slot engine, and among six others in a 7-slot engine
    (joining mid-run, in another slot, chained and overlapped): the same tokens, up to a near-tie
    of its slow twin's scores. Another seed draws others."""
    params = SamplingParams(temperature=1.0, top_k=60, top_p=0.95, repeat_penalty=1.1, seed=123, max_tokens=40)
    mine = (prompt(12, 99), params, ())

    def alone(p):
        engine = Engine(model, 1, max_len=128, buckets=BUCKETS)
        rid = engine.add_request(mine[0], p)
        engine.run_until_done()
        return engine.result(rid)

    others = [(prompt(4 + 9 * i, 200 + i), SAMPLED[i % len(SAMPLED)], ()) for i in range(6)]
    engine = Engine(model, 7, max_len=128, buckets=BUCKETS, chain=4, overlap=True)
    ids, _ = drive(engine, {0: others[:4], 3: [mine], 5: others[4:]})
    assert engine.requests[ids[4]].slot != 0
    # a batch of 7 rows, their windows and buckets, is other arithmetic than one row's: the two
    # replies part, if at all, only where the slow twin's scores leave a near-tie
    want = alone(params)
    assert_draws_as_its_slow_twin(model, mine[0], engine.result(ids[4]), params, engine.requests[ids[4]].seed, want)
    assert want != alone(replace(params, seed=124))


@pytest.mark.parametrize("n_slots, chain, overlap", [(1, 1, False), (7, 1, False), (7, 4, True), (64, 3, True)])
def test_greedy_equals_generate_at_many_rows_with_admissions(model, n_slots, chain, overlap):
    """1, 7 and 64 rows, chains of steps read back late or at once, requests joining while
    others run and more requests than slots: each reply equals one generate()."""
    n_req = max(3, 2 * n_slots)
    reqs = [(prompt(1 + (7 * i) % 60, 300 + i), SamplingParams(max_tokens=5 + (11 * i) % 30), ())
            for i in range(n_req)]
    reqs[1] = (prompt(120, 1), SamplingParams(max_tokens=30), ())  # fills its slot: "full" after 8
    for i in range(2, n_req, 3):  # a stop id the greedy reply reaches, mid-chain
        ids_, params, _ = reqs[i]
        reqs[i] = (ids_, params, (reference(model, ids_, params)[3],))
    engine = Engine(model, n_slots, max_len=128, buckets=BUCKETS, chain=chain, overlap=overlap)
    ids, steps = drive(engine, {0: reqs[:n_req // 2], 2: reqs[n_req // 2:n_req * 3 // 4], 6: reqs[n_req * 3 // 4:]})
    for rid, (ids_, params, stops) in zip(ids, reqs, strict=True):
        got = engine.result(rid)
        assert_generates(model, ids_, got, params, stops, what=rid)
        reason = "stop" if got[-1] in stops else "full" if len(ids_) + len(got) == 128 else "length"
        assert engine.finish_reason(rid) == reason, rid
    assert engine.finish_reason(ids[1]) == "full" and "stop" in {engine.finish_reason(r) for r in ids}
    events = [e for step in steps for e in step]
    assert len(events) == sum(len(engine.result(r)) for r in ids)
    assert engine.stats.rows == len(events) - len(ids)  # every token after the first came from a step


def test_finish_events_only(model):
    """token_events=False: step() returns one event a request, when it ends (its last token and
    the reason); the replies are the same."""
    reqs = [(prompt(3 + 5 * i, 40 + i), SamplingParams(max_tokens=4 + 3 * i), ()) for i in range(5)]
    runs = []
    for token_events in (True, False):
        engine = Engine(model, 2, max_len=64, buckets=(64,), chain=3, overlap=True, token_events=token_events)
        ids, steps = drive(engine, {0: reqs})
        runs.append(([engine.result(r) for r in ids], [e for step in steps for e in step]))
    (replies, every), (same, ends) = runs
    assert same == replies
    assert ends == [e for e in every if e.finish_reason is not None]
    assert sorted(e.request_id for e in ends) == list(range(5)) and all(e.finish_reason == "length" for e in ends)


def test_cancel_with_chains_in_flight(model):
    """Chains of 4 read a chain late: a request cancelled meanwhile gets none of the tokens in
    flight, its slot goes to the next request, and the others equal generate()."""
    engine = Engine(model, 2, max_len=64, buckets=(64,), chain=4, overlap=True)
    a = engine.add_request(prompt(4, 1), SamplingParams(max_tokens=40))
    b = engine.add_request(prompt(5, 2), SamplingParams(max_tokens=20))
    c = engine.add_request(prompt(6, 3), SamplingParams(max_tokens=9))
    engine.step()  # a and b admitted, a chain launched, nothing read yet
    engine.step()  # the first chain read (5 tokens each), the second in flight
    seen = engine.result(a)
    assert len(seen) == 5
    engine.cancel(a)
    engine.run_until_done()
    assert engine.result(a) == seen and engine.finish_reason(a) == "cancelled"
    assert engine.requests[c].slot == engine.requests[a].slot
    for rid, (n, seed, m) in ((b, (5, 2, 20)), (c, (6, 3, 9))):
        assert_generates(model, prompt(n, seed), engine.result(rid), SamplingParams(max_tokens=m), max_len=64, what=rid)


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
    assert_generates(model, prompt(4, 2), engine.result(b), SamplingParams(max_tokens=3), max_len=64)


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
    """Waiting requests are prefilled together (one right-padded forward per group), sorted by
    length (less padding), at most PREFILL_TOKENS padded tokens a group; greedy and penalized
    replies still equal generate()."""
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
    # the four first in line, shortest first: 3 x 30 and 2 x 50 padded tokens exceed 64
    assert groups[:3] == [[5, 10], [30], [50]]
    assert sorted(n for g in groups for n in g) == sorted(lens)
    for rid, (ids_, params, _) in zip(ids, reqs, strict=True):
        assert_generates(model, ids_, engine.result(rid), params, what=rid)


def test_the_compiled_slot_write_is_in_place():
    """The slot decode step's cache write under Inductor (issue 35, cause 1): each slot's K/V go
    straight into the cache. A scatter_ there compiled to a functional scatter of the whole
    cache into a cache-sized buffer and a copy back, every layer, every step (seen in this
    test's generated code before the fix: `empty_strided_cpu((8, 2, 65, 16)...)` and a
    `copy_`-named kernel writing the cache input)."""
    from torch._inductor.utils import run_and_get_code

    from tinyllm.kv_cache import SlotKVCache

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


def test_the_compiled_slot_step_allocates_nothing_cache_sized():
    """The whole slot step (model, sampler, end rules) under Inductor, with static shapes so
    that sizes are literals in its code: no buffer has the cache's length (max_len + 1 = 77
    positions, a size nothing else has), so no cache-sized temporary and no copy back (a
    scatter_ cache write made one of each, every layer, every step)."""
    import re

    from torch._inductor.utils import run_and_get_code

    engine = Engine(tiny_model(), 4, max_len=76, buckets=(32, 76))
    engine.add_request(prompt(5, 1), SamplingParams(max_tokens=8))
    engine.add_request(prompt(9, 2), SamplingParams(repeat_penalty=1.2, max_tokens=8))
    engine.step()  # admitted and one eager step: the caches exist
    dec, rows = engine.decoder, engine.slots.rows
    before = [t.clone() for t in engine.slots.k]
    torch._dynamo.reset()
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(dec.plain_step, fullgraph=True, dynamic=False), 32, 4)
    code = "\n".join(codes)
    allocs = re.findall(r"empty_strided_cpu\(\(([^)]*)\)", code)
    assert allocs and all(str(rows) not in re.split(r"[ ,]+", a) for a in allocs), allocs
    assert any(not torch.equal(a, b) for a, b in zip(before, engine.slots.k, strict=True))  # written in place


def test_one_compiled_step_serves_every_window_and_row_bucket():
    """The compiled step takes the window and the row count as dynamic sizes: a run that uses
    two windows and two row buckets traces one graph (a retrace on the H200 costs 20-100 s)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    engine = Engine(tiny_model(), 16, max_len=256, buckets=(128, 256), compile="inductor", chain=2)
    early = [(prompt(5 + i, 500 + i), SamplingParams(max_tokens=6), ()) for i in range(3)]  # 8 rows, window 128
    late = [(prompt(120 + 5 * i, 600 + i), SamplingParams(max_tokens=20), ()) for i in range(12)]  # 16, 256
    shapes = set()
    ids, i = [], 0
    while i < 10 or engine.has_work:
        ids += [engine.add_request(*args) for args in {0: early, 6: late}.get(i, ())]
        engine.step()
        shapes.add((engine.decoder.window, engine.decoder.rows))
        i += 1
    assert {(128, 8), (256, 16)} <= shapes
    assert counters["stats"]["unique_graphs"] == 1
    for rid, (ids_, params, _) in zip(ids, early + late, strict=True):
        assert_generates(engine.model, ids_, engine.result(rid), params, max_len=256, what=rid)
