"""The in-step sampler against sample(), the reference, for every setting (CPU); the native
step's C++ Sampler against the in-step sampler."""

import itertools

import pytest
import torch

from tinyllm.decode import cpu_step
from tinyllm.decode.sampling import SamplingParams, noise_at, sample, seed_key
from tinyllm.decode.step_sampler import REPEAT_WINDOW, StepSampler
from tinyllm.kernels import cpu_qgemv

SETTINGS = [dict(temperature=t, top_k=k, top_p=p, repeat_penalty=r)
            for t, k, p, r in itertools.product((0.0, 0.7, 1.3), (0, 1, 5, 300), (1.0, 0.9, 0.3), (1.0, 1.3))]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_draw_equals_sample_with_the_same_noise(setting):
    B, V = 3, 300
    g = torch.Generator().manual_seed(len(str(setting)))
    params = SamplingParams(**setting, seed=1234)
    s = StepSampler(B, V, "cpu")
    context = torch.randint(0, V, (B, 90), generator=g)
    s.load(params, recent=context[:, :-1])
    prev = context[:, :-1]
    for step in range(6):
        fed = context[:, 89 - 5 + step:90 - 5 + step] if step < 5 else torch.zeros(B, 1, dtype=torch.long)
        s.push(fed)
        prev = torch.cat([prev, fed], dim=1)[:, -REPEAT_WINDOW:]
        logits = torch.randn(B, V, generator=g) * 3
        noise = noise_at(s.key, s.counter, B, V)
        want = sample(logits, params, prev=prev, noise=noise)
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
    context = torch.randint(0, n_valid, (1, 40), generator=g)
    py.load(params, recent=context)
    cpp.load(params, recent=context)
    tok = torch.zeros(1, 1, dtype=torch.long)
    drawn = []
    for _ in range(8):
        fed = torch.randint(0, n_valid, (1, 1), generator=g)
        logits = torch.randn(1, V, generator=g) * 3
        py.push(fed)
        want = py.draw(logits)
        tok.copy_(fed)
        cpu_step.native_draw(cpp, logits, tok)
        assert int(tok) == int(want), (setting, n_valid)
        drawn.append(int(tok))
    assert torch.equal(cpp.ring, py.ring) and torch.equal(cpp.ring_at, py.ring_at)
    assert torch.equal(cpp.counter, py.counter)
    assert max(drawn) < n_valid
