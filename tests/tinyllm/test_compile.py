"""The compiled decode step (`compile="inductor"`) on the CPU: torch.compile of the static
step, against the plain static step and against generate(). On CUDA the same compiled step is
captured into the bucket graphs (test_cuda_graph_cuda.py checks replay against it bit for bit)."""

import torch

from tests.tinyllm.forced import assert_same_draws
from tests.tinyllm.test_engine import assert_generates, prompt
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode.engine import Engine
from tinyllm.decode.sampling import SamplingParams

BUCKETS = (32, 64)


@torch.no_grad()
def test_compiled_step_matches_the_plain_step_across_buckets(model):
    ids = torch.tensor([prompt(20, 5)])  # (1, 20): decode crosses W 32 -> 64
    plain = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False)
    fast = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False, compile="inductor")
    a, b = plain.prefill(ids), fast.prefill(ids)
    logits = ([], [])
    for _ in range(40):
        tok = a[:, -1].argmax(-1, keepdim=True)  # (1, 1): both are fed the plain step's greedy token
        a, b = plain.step(tok), fast.step(tok)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        logits[0].append(a[0, -1].clone())
        logits[1].append(b[0, -1].clone())
    assert fast.window == 64 and fast.n == 60
    plain_l, fast_l = torch.stack(logits[0]), torch.stack(logits[1])  # (40, V)
    # the compiled step's argmax is the plain one's wherever no near-tie can flip it
    assert_same_draws(plain_l, plain_l.argmax(-1).tolist(), (fast_l.argmax(-1).tolist(), fast_l))


def test_compiled_engine_equals_generate_per_request(model):
    lens = (5, 30, 12)
    engine = Engine(model, 2, max_len=64, buckets=BUCKETS, compile="inductor")
    params = SamplingParams(max_tokens=20)
    ids = [engine.add_request(prompt(n, n), params) for n in lens]
    engine.run_until_done()
    for rid, n in zip(ids, lens, strict=True):
        assert_generates(model, prompt(n, n), engine.result(rid), params, max_len=64, what=rid)  # up to a near-tie
