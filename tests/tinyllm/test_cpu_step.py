"""The native CPU decode step (tinyllm.decode.cpu_step: the whole step as one C++ call) against its
slow twins: the same decoder's eager step, the eager KVCache decode and a full forward without
a cache, for dense and quantized models, left padding, and the greedy and sampled draws in C++
against the Python sampler (tinyllm.decode.step_sampler). A native decode is fed the eager one's
tokens (teacher-forced, tests/tinyllm/forced.py): run free, two decodes whose arithmetic differs
part at the first near-tie and compare different texts from there."""

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_same_draws
from tinyllm.core.linear import DenseLinear
from tinyllm.core.quant_linear import QuantEmbedding, QuantLinear
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.decode.sampling import SamplingParams
from tinyllm.formats.build import quantize_model
from tinyllm.kernels import cpu_qgemv

pytestmark = pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")

# A shape whose widths are multiples of 32, so every matrix can be int8 or int4; tied
# embeddings, so the embedding is quantized too.
SHAPE = dict(dim=128, n_heads=4, n_kv_heads=2, ffn_dim=192, tie_embeddings=True)


def decoder(model, backend, batch=1, max_len=256, kv_dtype=torch.float32):
    """A decoder running the native step (backend "native") or the plain one (None), its cache
    held in kv_dtype (fp32 here: the steps meet at fp32 rounding; tests/tinyllm/test_cpu_kv_cache.py
    runs the bf16 cache the native step holds by default)."""
    dec = GraphDecoder(model, batch, max_len=max_len, use_graph=False)
    dec.cache.kv_dtype = kv_dtype
    if backend == "native":
        cpu_step.use_native(dec, kv_dtype)
    return dec


def decode(model, backend, prompt, steps, params=None, pad_lens=None, max_len=256, follow=None):
    """Logits (steps, V) and ids (the step's own draws) of `steps` decode steps after prefilling
    prompt (1, T). Each step is fed the draw before it, or with `follow` (another decode's ids) that
    decode's draw before it: teacher-forced, both read one text."""
    dec = decoder(model, backend, max_len=max_len)
    if params is not None:
        dec.sampler.load(params, recent=prompt)
    with torch.no_grad():
        dec.prefill(prompt, pad_lens)
        dec.tok.copy_(prompt[:, -1:])  # the first step re-feeds the last prompt id: a fixed input
        logits, ids = [], []
        for i in range(steps):
            if follow is not None and i > 0:
                dec.tok.fill_(follow[i - 1])
            logits.append(dec.run(1)[0, -1].clone())
            ids.append(int(dec.tok))
    return torch.stack(logits), ids


def prompt_of(model, n=19, seed=1):
    return torch.randint(0, model.cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("matrices", ["fp32", "bf16"])
def test_dense_step_equals_the_eager_step_and_a_full_forward(matrices):
    model = tiny_model(3)
    if matrices == "bf16":  # matrices held at 16 bits, as a CPU keeps a file's bf16 ones
        for m in model.modules():
            if type(m) is DenseLinear:
                m.weight.data = m.weight.data.bfloat16()
    assert cpu_step.problem(model, 1) is None
    prompt = prompt_of(model)
    eager, eager_ids = decode(model, None, prompt, 24)
    native, ids = decode(model, "native", prompt, 24, follow=eager_ids)
    torch.testing.assert_close(native, eager, rtol=1e-4, atol=1e-4)
    assert_same_draws(eager, eager_ids, (ids, native))
    # the slow twin without any cache: the whole sequence at once
    seq = torch.cat([prompt, prompt[:, -1:], torch.tensor([eager_ids[:-1]])], dim=1)  # what the steps fed
    with torch.no_grad():
        full = model(seq)[0][0, prompt.shape[1]:]  # (24, V)
    torch.testing.assert_close(native, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["int8", "int4", "int4, fp16 embedding scales"])
def test_quantized_step_equals_the_eager_step(kind):
    model = quantize_model(tiny_model(4, **SHAPE), kind[:4])
    assert isinstance(model.tok_emb, QuantEmbedding) and isinstance(model.blocks[0].ffn.w2, QuantLinear)
    if "fp16" in kind:  # QuantEmbedding holds scales and zeros apart, fp16 where exact: one of each
        model.tok_emb.scales = model.tok_emb.scales.half()
    assert cpu_step.problem(model, 1) is None
    prompt = prompt_of(model)
    eager, eager_ids = decode(model, None, prompt, 32)
    native, ids = decode(model, "native", prompt, 32, follow=eager_ids)
    # The same kernels on inputs equal up to fp32 rounding; x's rounding to int8 blocks can move
    # by one step where an input sits on a boundary, hence the looser tolerance.
    torch.testing.assert_close(native, eager, rtol=0, atol=2e-2 * eager.abs().max().item())
    assert_same_draws(eager, eager_ids, (ids, native))


def test_with_exact_x_the_int8_step_equals_the_eager_step_tightly():
    """x not rounded to int8 blocks (cpu_qgemv.use_exact_x): nothing can jump, so the native
    step meets the eager one at fp32 rounding, as the dense models do."""
    model = quantize_model(tiny_model(4, **SHAPE), "int8")
    prompt = prompt_of(model)
    before = cpu_qgemv.use_exact_x(True)
    try:
        eager, eager_ids = decode(model, None, prompt, 32)
        native, ids = decode(model, "native", prompt, 32, follow=eager_ids)
    finally:
        cpu_qgemv.use_exact_x(before)
    torch.testing.assert_close(native, eager, rtol=1e-4, atol=1e-4)
    assert_same_draws(eager, eager_ids, (ids, native))


def test_left_padding_is_masked_as_the_eager_step_masks_it():
    model = tiny_model(5)
    prompt = prompt_of(model, 12)
    pads = torch.tensor([5])  # the first 5 positions are padding: never attended
    eager, eager_ids = decode(model, None, prompt, 16, pad_lens=pads)
    native, ids = decode(model, "native", prompt, 16, pad_lens=pads, follow=eager_ids)
    torch.testing.assert_close(native, eager, rtol=1e-4, atol=1e-4)
    unpadded, _ = decode(model, "native", prompt, 16, follow=eager_ids)
    assert (native - unpadded).abs().max() > 1e-3  # the mask changed something


def test_the_greedy_draw_in_cpp_applies_the_repetition_penalty():
    model = tiny_model(6)
    prompt = prompt_of(model, 8)
    params = SamplingParams(repeat_penalty=1.8)
    _, eager_ids = decode(model, None, prompt, 40, params)
    _, ids = decode(model, "native", prompt, 40, params, follow=eager_ids)
    _, plain_ids = decode(model, "native", prompt, 40, follow=eager_ids)
    assert ids == eager_ids  # drawn from the logits after the penalty, which the steps do not return
    assert ids != plain_ids  # the penalty changed the draws


@pytest.mark.parametrize("settings", [dict(temperature=0.9, top_k=40, top_p=0.9),
                                      dict(temperature=1.3),  # no top-k, no top-p: every id may come
                                      dict(temperature=0.7, top_k=5),
                                      dict(temperature=1.1, top_p=0.5, repeat_penalty=1.3)])
def test_the_sampled_draw_in_cpp_equals_the_python_samplers(settings):
    model = tiny_model(7)
    prompt = prompt_of(model, 8)
    params = SamplingParams(seed=11, **settings)
    eager, eager_ids = decode(model, None, prompt, 48, params)
    native, ids = decode(model, "native", prompt, 48, params, follow=eager_ids)
    assert ids == eager_ids  # one text, the same noise: each draw (logits within 1e-6) the same
    torch.testing.assert_close(native, eager, rtol=1e-4, atol=1e-4)
    _, other_seed = decode(model, "native", prompt, 48, SamplingParams(seed=12, **settings))
    assert other_seed != ids  # the draws do depend on the noise


def test_padded_embeddings_are_never_drawn():
    model = tiny_model(8)
    dec = decoder(model, "native", max_len=64)
    dec.sampler.n_valid = 3  # only ids 0, 1, 2 may be drawn
    with torch.no_grad():
        dec.prefill(prompt_of(model, 4))
        dec.tok.fill_(1)  # the first token, chosen
        drawn = set()
        for _ in range(10):
            dec.run(1)
            drawn.add(int(dec.tok))
    assert drawn <= {0, 1, 2}


def test_a_full_cache_is_refused_and_the_step_goes_on_after_a_rewind():
    model = tiny_model(9)
    dec = decoder(model, "native", max_len=24)
    with torch.no_grad():
        dec.prefill(prompt_of(model, 20))
        dec.tok.fill_(1)
        dec.run(4)
        with pytest.raises(ValueError, match="KV cache full"):
            dec.run(1)
        dec.truncate(10)
        assert dec.run(2).shape == (1, 1, model.cfg.vocab_size)
    assert dec.n == 12


def test_a_layout_the_cpp_side_refuses_falls_back_to_the_plain_step(capsys):
    model = tiny_model(11)
    model.norm.weight.data = torch.ones(2 * model.cfg.dim)[::2]  # not contiguous: the C++ side refuses it
    assert cpu_step.problem(model, 1) is None
    native, ids = decode(model, "native", prompt_of(model), 8)
    eager, eager_ids = decode(model, None, prompt_of(model), 8)
    assert ids == eager_ids and torch.equal(native, eager)
    assert "native CPU step refused this model (norm must be fp32" in capsys.readouterr().err


def test_what_the_native_step_does_not_run():
    model = tiny_model(10)
    assert "batch 2" in cpu_step.problem(model, 2)
    assert "bfloat16" in cpu_step.problem(tiny_model(10).to(torch.bfloat16), 1)
    dec = decoder(model, "native", batch=2, max_len=32)
    with torch.no_grad(), pytest.raises(ValueError, match="batch 2"):
        dec.prefill(torch.zeros(2, 4, dtype=torch.long))
        dec.tok.fill_(1)
        dec.run(1)


@pytest.mark.parametrize("settings", [dict(temperature=1.5, top_k=50), dict(temperature=1.2, top_p=0.95)])
def test_sampled_draws_below_n_valid_equal_the_python_samplers(settings):
    """Embeddings padded past the tokenizer (n_valid < V) in a sampled draw: the C++ draw drops
    those ids before top-k (here more than the ids left) and top-p, as StepSampler.draw does."""
    model = tiny_model(8)
    prompt = prompt_of(model, 8)

    def draws(backend, follow=None):
        dec = decoder(model, backend, max_len=96)
        dec.sampler.load(SamplingParams(seed=5, **settings), recent=prompt)
        dec.sampler.n_valid = 40
        with torch.no_grad():
            dec.prefill(prompt)
            dec.tok.copy_(prompt[:, -1:])
            ids = []
            for i in range(48):
                if follow is not None and i > 0:
                    dec.tok.fill_(follow[i - 1])  # the other decode's text (teacher-forced)
                dec.run(1)
                ids.append(int(dec.tok))
        return ids

    plain = draws(None)
    native = draws("native", follow=plain)
    assert native == plain
    assert max(native) < 40 and len(set(native)) > 5  # sampled, from the ids below n_valid only
