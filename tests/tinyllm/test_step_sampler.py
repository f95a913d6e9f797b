"""The in-step sampler against sample(), the reference, for every setting (CPU); the native
step's C++ Sampler against the in-step sampler; DRY (sampling.apply_dry) against a plain loop
that says llama.cpp's rule, and in every sampler."""

import itertools

import pytest
import torch

from tinyllm.decode import cpu_step
from tinyllm.decode.sampling import SamplingParams, apply_dry, noise_at, sample, seed_key
from tinyllm.decode.sampling_params import DRY_MAX_MATCH, DRY_WINDOW
from tinyllm.decode.step_sampler import REPEAT_WINDOW, StepSampler
from tinyllm.kernels import cpu_qgemv

SETTINGS = [dict(temperature=t, top_k=k, top_p=p, repeat_penalty=r)
            for t, k, p, r in itertools.product((0.0, 0.7, 1.3), (0, 1, 5, 300), (1.0, 0.9, 0.3), (1.0, 1.3))]
DRY = [dict(dry_multiplier=m, dry_base=b, dry_allowed_length=a, dry_last_n=n)
       for m, b, a, n in ((0.8, 1.75, 2, DRY_WINDOW), (2.0, 1.1, 1, 40), (0.5, 3.0, 3, 12))]
SETTINGS += [{**s, **d} for s in SETTINGS[::7] for d in DRY]


def loopy(g: torch.Generator, B: int, N: int, V: int) -> torch.Tensor:
    """(B, N) ids from a small alphabet with repeated phrases: DRY has matches to find."""
    phrases = torch.randint(0, min(V, 12), (6, 5), generator=g)
    rows = [torch.cat([phrases[i] for i in torch.randint(0, 6, (N // 5 + 1,), generator=g)])[:N] for _ in range(B)]
    return torch.stack(rows)


def dry_by_hand(logits, hist, breaker, mult, base, allowed, last_n):
    """llama.cpp's rule, one earlier span at a time: for each end j of a span that equals the
    history's latest span (matched back over at most DRY_MAX_MATCH ids, inside last_n, never
    over a breaker), the id after j loses mult * base^(match - allowed) if match >= allowed."""
    out = logits.clone()
    for b in range(hist.shape[0]):
        h = [int(t) for t in hist[b, -last_n:] if t >= 0]
        pen = {}
        for j in range(len(h) - 1):
            run = 0
            while (run < DRY_MAX_MATCH and j - run >= 0 and not breaker[h[-1 - run]]
                   and h[j - run] == h[-1 - run]):
                run += 1
            if run >= allowed:
                pen[h[j + 1]] = max(pen.get(h[j + 1], 0.0), mult * base ** (run - allowed))
        for t, v in pen.items():
            out[b, t] -= v
    return out


@pytest.mark.parametrize("dry", DRY, ids=lambda d: "-".join(f"{v}" for v in d.values()))
def test_dry_equals_the_rule_by_hand(dry):
    B, V = 3, 50
    g = torch.Generator().manual_seed(7)
    penalized = 0
    for N in (1, 2, 9, 60, 200, 1500):
        hist = loopy(g, B, N, V)
        hist[0, : N // 3] = -1  # a history not yet full
        breaker = torch.zeros(V, dtype=torch.bool)
        breaker[[3, 7]] = True
        logits = torch.randn(B, V, generator=g)
        args = (dry["dry_multiplier"], dry["dry_base"], dry["dry_allowed_length"], dry["dry_last_n"])
        got = apply_dry(logits, hist, breaker, *args)
        want = dry_by_hand(logits, hist, breaker, *args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        penalized += int((got != logits).sum())
    assert penalized, "the loopy histories have repeats to penalize"


def test_dry_stops_at_breakers_and_spares_short_repeats():
    V = 10
    logits = torch.zeros(1, V)
    breaker = torch.zeros(V, dtype=torch.bool)
    hist = torch.tensor([[1, 2, 3, 4, 1, 2, 3]])  # "1 2 3" said again: 4 would repeat 3 ids
    out = apply_dry(logits, hist, breaker, 1.0, 2.0, 2, DRY_WINDOW)
    assert out[0, 4] == -2.0 and (out[0, :4] == 0).all() and (out[0, 5:] == 0).all()  # 1 * 2^(3-2)
    breaker[2] = True  # the match "1 2 3" crosses 2: only "3" matches, below allowed 2
    assert torch.equal(apply_dry(logits, hist, breaker, 1.0, 2.0, 2, DRY_WINDOW), logits)
    assert torch.equal(apply_dry(logits, hist, torch.zeros(V, dtype=torch.bool), 1.0, 2.0, 4, DRY_WINDOW), logits)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_draw_equals_sample_with_the_same_noise(setting):
    B, V = 3, 300
    g = torch.Generator().manual_seed(len(str(setting)))
    params = SamplingParams(**setting, seed=1234)
    s = StepSampler(B, V, "cpu")
    breaker = torch.zeros(V, dtype=torch.bool)
    breaker[[3, 7]] = True
    s.set_breakers([3, 7])
    context = loopy(g, B, 90, V)
    s.load(params, recent=context[:, :-1])
    prev = history = context[:, :-1]
    for step in range(6):
        fed = context[:, 89 - 5 + step:90 - 5 + step] if step < 5 else torch.zeros(B, 1, dtype=torch.long)
        s.push(fed)
        prev = torch.cat([prev, fed], dim=1)[:, -REPEAT_WINDOW:]
        history = torch.cat([history, fed], dim=1)
        logits = torch.randn(B, V, generator=g) * 3
        noise = noise_at(s.key, s.counter, B, V)
        want = sample(logits, params, prev=prev, noise=noise, history=history, breaker=breaker)
        got = s.draw(logits)
        assert torch.equal(got, want), (setting, step)
    assert int(s.counter) == (0 if params.greedy else 6)


def test_ring_holds_the_last_window_of_ids():
    s = StepSampler(1, 1000, "cpu")
    s.load(SamplingParams(repeat_penalty=1.1), recent=torch.arange(3)[None])  # fewer ids than the window
    assert set(s.ring[0].tolist()) == {0, 1, 2}
    for i in range(100, 100 + REPEAT_WINDOW + 5):
        s.push(torch.tensor([[i]]))
    assert sorted(s.ring[0].tolist()) == list(range(105, 100 + REPEAT_WINDOW + 5))


def test_noise_is_a_function_of_seed_and_counter():
    key, other = torch.tensor(seed_key(7)), torch.tensor(seed_key(7 + (1 << 40)))
    a = noise_at(key, torch.tensor([3]), 2, 5000)
    assert torch.equal(a, noise_at(key, torch.tensor([3]), 2, 5000))
    assert not torch.equal(a, noise_at(key, torch.tensor([4]), 2, 5000))
    assert not torch.equal(a, noise_at(other, torch.tensor([3]), 2, 5000))  # the high half counts
    assert not torch.equal(a[0], a[1])
    # Exponential(1): mean 1, P(x > 1) = e^-1
    assert abs(a.mean().item() - 1) < 0.03 and abs((a > 1).float().mean().item() - 0.3679) < 0.01


def test_sampled_frequencies_follow_the_distribution():
    V, n = 4, 4000
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    s = StepSampler(1, V, "cpu")
    s.load(SamplingParams(temperature=1.0, seed=5), recent=torch.zeros(1, 1, dtype=torch.long))
    counts = torch.bincount(torch.cat([s.draw(probs.log()[None]) for _ in range(n)]), minlength=V)
    assert (counts / n - probs).abs().max() < 0.03


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
@pytest.mark.parametrize("n_valid", [300, 40])
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_the_cpp_draw_equals_the_python_draw(setting, n_valid):
    """The C++ step's Sampler (cpu_sampler.cpp, through cpu_step.native_draw) against StepSampler's
    push and draw, each on its own copy of the same state: the same ids for the same seed,
    logits and settings, and the same state after (the penalty's ring, the noise's counter).
    n_valid 40: ids past it are never drawn, before top-k and top-p."""
    V = 300
    g = torch.Generator().manual_seed(len(str(setting)) + n_valid)
    params = SamplingParams(**setting, seed=99)
    py, cpp = StepSampler(1, V, "cpu", n_valid), StepSampler(1, V, "cpu", n_valid)
    py.set_breakers([3, 7])
    cpp.set_breakers([3, 7])
    context = loopy(g, 1, 40, n_valid)
    py.load(params, recent=context)
    cpp.load(params, recent=context)
    tok = torch.zeros(1, 1, dtype=torch.long)
    drawn = []
    for _ in range(8):
        fed = loopy(g, 1, 1, n_valid)
        logits = torch.randn(1, V, generator=g) * 3
        py.push(fed)
        want = py.draw(logits)
        tok.copy_(fed)
        cpu_step.native_draw(cpp, logits, tok)
        assert int(tok) == int(want), (setting, n_valid)
        drawn.append(int(tok))
    assert torch.equal(cpp.ring, py.ring) and torch.equal(cpp.ring_at, py.ring_at) and torch.equal(cpp.hist, py.hist)
    assert torch.equal(cpp.counter, py.counter)
    assert max(drawn) < n_valid


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_dry_turns_every_sampler_off_the_repeat(temperature):
    """The id that would say "1 2 3 4" a second time is the likeliest; DRY at 100 makes every
    sampler (sample(), StepSampler, the C++ Sampler) draw another, and none does at 0."""
    V = 10
    logits = torch.zeros(1, V)
    logits[0, 4] = 5.0
    context = torch.tensor([[1, 2, 3, 4, 1, 2]])
    for mult, repeats in ((100.0, False), (0.0, True)):
        params = SamplingParams(temperature=temperature, seed=3, dry_multiplier=mult)
        py, cpp = StepSampler(1, V, "cpu"), StepSampler(1, V, "cpu")
        for s in (py, cpp):
            s.load(params, recent=context)
        py.push(torch.tensor([[3]]))
        tok = torch.tensor([[3]])
        cpu_step.native_draw(cpp, logits, tok)
        history = torch.cat([context, torch.tensor([[3]])], dim=1)
        ref = sample(logits, params, prev=history, noise=noise_at(py.key, py.counter, 1, V), history=history)
        assert int(py.draw(logits)) == int(tok) == int(ref)
        assert (int(tok) == 4) == repeats


def test_the_row_sampler_draws_as_sample_with_dry():
    """The engine's RowSampler, rows of their own settings (DRY on and off, greedy and sampled)
    side by side: each row draws as sample() with its history, breakers and its own noise."""
    from tinyllm.decode.row_sampler import RowSampler
    from tinyllm.decode.sampling import row_noise

    V, S = 300, 4
    g = torch.Generator().manual_seed(11)
    rows = [SamplingParams(dry_multiplier=0.8, repeat_penalty=1.1),
            SamplingParams(temperature=0.8, dry_multiplier=2.0, dry_base=1.2, dry_allowed_length=1, dry_last_n=30),
            SamplingParams(temperature=1.1, top_k=5, seed=4),
            SamplingParams(temperature=0.7, top_p=0.9, dry_multiplier=0.5, dry_allowed_length=3)]
    seeds = [5, 6, 7, 8]
    tails = [loopy(g, 1, n, 12)[0].tolist() for n in (3, 50, 80, 1200)]
    rs = RowSampler(S, V, "cpu")
    rs.set_breakers([3, 7])
    breaker = torch.zeros(V, dtype=torch.bool)
    breaker[[3, 7]] = True
    rs.load(torch.arange(S), rows, seeds, tails)
    rs.pick_variant(rows)
    history = [list(t) for t in tails]
    for step in range(6):
        fed = loopy(g, S, 1, 12)
        rs.push(fed, S)
        logits = torch.randn(S, V, generator=g) * 3
        got = rs.draw(logits, S)
        for r, p in enumerate(rows):
            history[r].append(int(fed[r]))
            noise = row_noise(torch.tensor([seed_key(seeds[r])]), torch.tensor([step]), torch.arange(V)[None])
            want = sample(logits[r:r + 1], p, prev=torch.tensor([history[r][-REPEAT_WINDOW:]]), noise=noise,
                          history=torch.tensor([history[r]]), breaker=breaker)
            assert int(got[r]) == int(want), (r, step)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_unfiltered_greedy_draw_is_the_filtered_draw_with_the_filters_off(dtype):
    """No penalty and no DRY (load sets `filtered` False): the step skips both and takes the argmax
    of the valid ids' logits in their own dtype; the same ids as the full path (the penalty of 1
    and DRY's multiplier of 0 run, on fp32 logits, with the ids past n_valid at -inf), ties and
    a maximum among the padded ids included. Sampling with the filters off draws the same too."""
    B, V, n_valid = 3, 70, 64
    g = torch.Generator().manual_seed(3)
    recent = loopy(g, B, 40, V)
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_k=5, seed=1)):
        fast, full = StepSampler(B, V, "cpu", n_valid), StepSampler(B, V, "cpu", n_valid)
        fast.load(params, recent)
        full.load(params, recent)
        assert fast.variant == (params.greedy, False)
        full.filtered = True  # the penalty (1) and DRY (0) run
        for _ in range(20):
            logits = torch.randn(B, V, generator=g).to(dtype)
            logits[0, n_valid + 2] = 100.0  # a padded id's logit above every valid one
            logits[1, [5, 9]] = logits[1].max() + 1  # a tie: the first is drawn
            ids = torch.randint(0, V, (B, 1), generator=g)
            fast.push(ids)
            full.push(ids)
            want = full.draw(logits.clone())
            assert torch.equal(fast.draw(logits.clone()), want)
            assert (want < n_valid).all() and (not params.greedy or want[1] == 5)
        assert torch.equal(fast.ring, full.ring) and torch.equal(fast.hist, full.hist)
    filtered = StepSampler(B, V, "cpu", n_valid)
    filtered.load(SamplingParams(repeat_penalty=1.1), recent)
    assert filtered.variant == (True, True)
    filtered.load(SamplingParams(dry_multiplier=0.8), recent)
    assert filtered.variant == (True, True)
