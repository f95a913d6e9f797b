"""The CPU decode attention op (torch.ops.tinyllm_cpu.decode_attention, in tinyllm/kernels/cpu_qgemv.cpp)
against its slow twin model.window_attention and against float64: windows sliced from a longer
cache, masks with holes, several chunks of 256 keys, 1 and 2 threads, fp32 and bf16; and the
compiled CPU step that calls it against the plain step and generate()."""

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_same_draws, eager_logits
from tinyllm.core.ops import window_attention
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.kernels import cpu_qgemv, decode_attention

needs_kernel = pytest.mark.skipif(not cpu_qgemv.available(), reason="no AVX2 kernel on this machine")
# (B, Hkv, R, D, W): R in one pass of up to 4 rows or several (5: 4 + 1, 8: 4 + 4), D in 16-wide
# passes or ending in an 8-wide one (24, 40)
SHAPES = [(1, 3, 3, 64, 1000), (2, 2, 4, 32, 300), (1, 1, 1, 128, 17), (1, 4, 8, 256, 600), (3, 1, 2, 16, 513),
          (1, 2, 5, 24, 77), (2, 1, 7, 40, 260)]


def inputs(b, hkv, r, d, w, dtype, seed):
    """q (B, Hkv, R, D), k and v (B, Hkv, W, D) sliced from a cache of 2W + 5 positions, mask
    (B, 1, 1, W) with about a third of the keys masked (key 0 always attended)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hkv, r, d, generator=g).to(dtype)
    kc, vc = (torch.randn(b, hkv, 2 * w + 5, d, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(b, 1, 1, w, generator=g) < 0.65
    mask[..., 0] = True
    return q, kc[:, :, :w], vc[:, :, :w], mask


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_equals_window_attention(shape, threads):
    torch.set_num_threads(threads)
    q, k, v, mask = inputs(*shape, torch.float32, seed=sum(shape))
    assert shape[0] * shape[1] == 1 or not k.is_contiguous()  # read in place through its strides
    scale = shape[3] ** -0.5
    got = torch.ops.tinyllm_cpu.decode_attention(q, k, v, mask, scale)
    torch.testing.assert_close(got, window_attention(q, k, v, mask, scale), rtol=1e-5, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_bf16_is_as_close_to_float64_as_window_attention(shape):
    q, k, v, mask = inputs(*shape, torch.bfloat16, seed=7)
    scale = shape[3] ** -0.5
    got = torch.ops.tinyllm_cpu.decode_attention(q, k, v, mask, scale)
    exact = window_attention(q.double(), k.double(), v.double(), mask, scale)
    ref = window_attention(q, k, v, mask, scale)
    assert got.dtype == torch.bfloat16
    # scores and weights stay fp32 here (window_attention rounds them to bf16): one bf16 rounding
    assert (got.double() - exact).abs().max() <= max((ref.double() - exact).abs().max().item(), 2 ** -8)


@needs_kernel
def test_results_do_not_depend_on_the_thread_count():
    q, k, v, mask = inputs(1, 3, 3, 64, 2000, torch.float32, seed=3)  # 8 chunks a head
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append(torch.ops.tinyllm_cpu.decode_attention(q, k, v, mask, 0.125))
    assert torch.equal(outs[0], outs[1])


@needs_kernel
def test_masked_keys_are_never_read_and_a_row_with_no_key_is_zero():
    q, k, v, mask = inputs(1, 2, 2, 32, 300, torch.float32, seed=5)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, ~mask[0, 0, 0]] = float("nan")
    poisoned_v[:, :, ~mask[0, 0, 0]] = float("nan")
    torch.testing.assert_close(torch.ops.tinyllm_cpu.decode_attention(q, poisoned_k, poisoned_v, mask, 0.2),
                               window_attention(q, k, v, mask, 0.2), rtol=1e-5, atol=1e-6)
    none = torch.zeros_like(mask)
    assert torch.equal(torch.ops.tinyllm_cpu.decode_attention(q, k, v, none, 0.2), torch.zeros_like(q))


@needs_kernel
def test_a_mask_shared_by_the_batch_broadcasts():
    q, k, v, mask = inputs(3, 2, 2, 32, 300, torch.float32, seed=9)
    one = mask[:1]
    assert decode_attention.supported(q, k, v, one)
    torch.testing.assert_close(torch.ops.tinyllm_cpu.decode_attention(q, k, v, one, 0.2),
                               window_attention(q, k, v, one, 0.2), rtol=1e-5, atol=1e-6)


@needs_kernel
@torch.no_grad()
def test_the_compiled_step_calls_the_op_and_follows_the_plain_step_and_generate():
    """Decode past 256 keys (two chunks) with the compiled step, against the plain step's
    logits, both fed the plain step's greedy tokens, and generate()'s steps fed the same tokens:
    their draws are the plain step's wherever no near-tie can flip them."""
    torch.set_num_threads(2)
    model = tiny_model()
    prompt = torch.tensor([[5, 17, 99, 3, 250, 41, 7, 300]])
    plain = GraphDecoder(model, 1, max_len=320, buckets=(320,), use_graph=False)
    fast = GraphDecoder(model, 1, max_len=320, buckets=(320,), use_graph=False, compile="inductor")
    a, b = plain.prefill(prompt), fast.prefill(prompt)
    tokens, logits = [], []
    for step in range(300):
        tok = a[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        tokens.append(tok.item())
        if step == 1:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                a, b = plain.step(tok), fast.step(tok)
            assert any("tinyllm_cpu::decode_attention" in e.name for e in prof.events())
        else:
            a, b = plain.step(tok), fast.step(tok)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        logits.append(a[0, -1].clone())
    assert fast.n == 308
    gen = eager_logits(model, prompt, tokens[:-1])  # (299, V): generate()'s steps after tokens[i]
    assert_same_draws(torch.stack(logits[:-1]), tokens[1:], (gen.argmax(-1).tolist(), gen))
