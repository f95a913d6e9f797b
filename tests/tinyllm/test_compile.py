"""The compiled decode step (`compile="inductor"`) on the CPU: torch.compile of the static
step, against the plain static step and against generate(). On CUDA the same compiled step is
captured into the bucket graphs (test_cuda_graph_cuda.py checks replay against it bit for bit)."""

import torch

from tests.tinyllm.test_engine import prompt, reference
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.engine import Engine
from tinyllm.sampling import SamplingParams

BUCKETS = (32, 64)


@torch.no_grad()
def test_compiled_step_matches_the_plain_step_across_buckets(model):
    ids = torch.tensor([prompt(20, 5)])  # (1, 20): decode crosses W 32 -> 64
    plain = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False)
    fast = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False, compile="inductor")
    a, b = plain.prefill(ids), fast.prefill(ids)
    for _ in range(40):
        tok = a[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        assert torch.equal(tok, b[:, -1].argmax(-1, keepdim=True))
        a, b = plain.step(tok), fast.step(tok)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert fast.window == 64 and fast.n == 60


def test_compiled_engine_equals_generate_per_request(model):
    lens = (5, 30, 12)
    engine = Engine(model, 2, max_len=64, buckets=BUCKETS, compile="inductor")
    params = SamplingParams(max_tokens=20)
    ids = [engine.add_request(prompt(n, n), params) for n in lens]
    engine.run_until_done()
    for rid, n in zip(ids, lens, strict=True):
        assert engine.result(rid) == reference(model, prompt(n, n), params, max_len=64)


@torch.no_grad()
def test_two_models_never_share_a_compiled_step(model):
    """The compiled step skips Dynamo's guards on the model's modules (cuda_graph.model_step).
    Were the step's code shared between models, a step traced for the dense model would run
    for its int8 copy (the same shapes, so the same cache: only module guards tell them apart)
    and read weights that copy does not have. Each decoder, run in turns in one process, must
    equal its own model's plain step; two decoders of one model share one compile."""
    import torch._dynamo

    from tinyllm.build import quantize_model

    int8 = quantize_model(model, "int8")
    ids = torch.tensor([prompt(12, 3)])
    decs = {}
    for name, m in (("dense", model), ("int8", int8)):
        decs[name] = (GraphDecoder(m, 1, max_len=64, buckets=BUCKETS, use_graph=False),
                      GraphDecoder(m, 1, max_len=64, buckets=BUCKETS, use_graph=False, compile="eager"))
    outs = {name: (plain.prefill(ids), fast.prefill(ids)) for name, (plain, fast) in decs.items()}
    for _ in range(6):
        for name, (plain, fast) in decs.items():  # in turns: each call finds the other's entries
            a, _ = outs[name]
            tok = a[:, -1].argmax(-1, keepdim=True)
            outs[name] = (plain.step(tok), fast.step(tok))
            torch.testing.assert_close(outs[name][1], outs[name][0], rtol=1e-5, atol=1e-5)
    assert not torch.equal(outs["dense"][0], outs["int8"][0])  # they do differ
    twin = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False, compile="eager")
    twin.prefill(ids)
    with torch._dynamo.config.patch(error_on_recompile=True):  # the first decoder's compile serves
        twin.step(ids[:, -1:])
