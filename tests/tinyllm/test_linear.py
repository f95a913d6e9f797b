"""The model's layers, one class per kernel (tinyllm.core.linear, tinyllm.core.quant_linear): each class that
runs on this CPU against the reference (x times the dequantized or widened matrix), its fused
forms against the layer run apart, what the native step reads of it, and the factories'
choice of class for each device, dtype and form. The CUDA kernels themselves: test_quant_cuda.py."""

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.core import quant
from tinyllm.core.linear import DenseEmbedding, DenseLinear, HalfCpuLinear, dense_linear
from tinyllm.core.quant import QTensor, quantize
from tinyllm.core.quant_linear import (
    CpuQgemvLinear,
    DequantLinear,
    FbgemmLinear,
    Int4PackLinear,
    Int8PackLinear,
    QuantEmbedding,
    TritonLinear,
    kernel_for,
    quant_linear,
)
from tinyllm.formats.build import build_transformer, quantize_model
from tinyllm.kernels import cpu_qgemv, qgemv
from tinyllm.model import RMSNorm

N, K = 96, 128  # N a multiple of 16 (aten's int4 kernel), K of 32 (the groups)
CPU, CUDA, META = torch.device("cpu"), torch.device("cuda"), torch.device("meta")


def weights(n=N, k=K, seed=0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def rows(m=5, k=K, dtype=torch.float32, seed=3) -> torch.Tensor:
    return torch.randn(1, m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)  # (B, T, K)


# class, kind, activations' dtype; each built directly, as the factory would where it picks it
QUANT = [(CpuQgemvLinear, "int8", torch.float32), (CpuQgemvLinear, "int4", torch.float32),
         (FbgemmLinear, "int8", torch.float32), (Int4PackLinear, "int4", torch.float32),
         (Int4PackLinear, "int4", torch.bfloat16), (Int8PackLinear, "int8", torch.float32),
         (Int8PackLinear, "int8", torch.bfloat16), (DequantLinear, "int8", torch.float32),
         (DequantLinear, "int4", torch.float32), (TritonLinear, "int8", torch.float32),
         (TritonLinear, "int4", torch.float32)]


def runs_here(cls) -> bool:
    if cls is CpuQgemvLinear:
        return cpu_qgemv.available()
    return cls is not FbgemmLinear or quant.fbgemm_available()


def tolerance(cls, x: torch.Tensor, qt: QTensor, ref: torch.Tensor) -> float:
    """How far the kernel may be from the reference: x rounded to int8 blocks of 32 (the AVX2
    kernel), x in 8 bits per tensor (fbgemm), bf16 activations, else fp32 rounding."""
    x, w = x.float(), qt.dequantize()
    if cls is CpuQgemvLinear:
        return (x.abs().max() / 254 * w.abs().sum(1).max()).item() + 1e-5
    if cls is FbgemmLinear:
        return 1.05 * (x.abs().max() / 127 * w.abs().sum(1).max()).item() + 1e-5
    if ref.dtype == torch.bfloat16:
        return 0.02 * ref.abs().max().item()
    return 1e-4 * ref.abs().max().item() + 1e-5


@pytest.mark.parametrize("cls,kind,dtype", QUANT, ids=[f"{c.__name__}-{k}-{str(d)[6:]}" for c, k, d in QUANT])
@torch.no_grad()
def test_each_quantized_class_equals_the_dequantized_product(cls, kind, dtype):
    if not runs_here(cls):
        pytest.skip(f"{cls.__name__} does not run here")
    qt = quantize(weights(), kind, 32)
    layer = cls(qt, dtype)
    for m in (1, 5, 20):  # decode, a few rows, a prefill's (the AVX2 kernel's GEMM path from 16)
        x = rows(m, dtype=dtype)
        ref = x.double() @ qt.dequantize(torch.float64).T  # (1, m, N)
        y = layer(x)
        assert y.shape == (1, m, N) and y.dtype == dtype
        assert (y.double() - ref).abs().max().item() <= tolerance(cls, x, qt, ref.to(dtype)), (cls, m)
    back = layer.qtensor()  # whatever the layout, the canonical form comes back
    assert back.kind == kind and torch.equal(back.qweight, qt.qweight)
    torch.testing.assert_close(back.scales, qt.scales)


@pytest.mark.parametrize("cls,kind,dtype", QUANT, ids=[f"{c.__name__}-{k}-{str(d)[6:]}" for c, k, d in QUANT])
@torch.no_grad()
def test_fused_and_swiglu_equal_the_layers_run_apart(cls, kind, dtype):
    """fused(x, norm, residual) = residual + layer(norm(x)); swiglu(down, x, norm) = x +
    down(silu(gate) * up) of norm(x). The AVX2 kernel's swiglu is one op (its hidden row rounded
    to int8 blocks once more): close; the others run the very same ops: equal."""
    if not runs_here(cls):
        pytest.skip(f"{cls.__name__} does not run here")
    norm = RMSNorm(K, 1e-5).to(dtype)
    norm.weight.data = (1 + 0.1 * torch.randn(K)).to(dtype)
    up = cls(quantize(weights(2 * 64, K, seed=1), kind, 32), dtype)  # gate and up: 64 rows each
    down = cls(quantize(weights(K, 64, seed=2), kind, 32), dtype)
    x = rows(3, dtype=dtype)
    res = rows(3, k=2 * 64, dtype=dtype, seed=4)
    assert torch.equal(up.fused(x, norm, res), res + up(norm(x)))
    assert torch.equal(up.fused(x), up(x))
    gate, u = up(norm(x)).chunk(2, dim=-1)
    apart = x + down(torch.nn.functional.silu(gate) * u)
    if cls is CpuQgemvLinear:
        torch.testing.assert_close(up.swiglu(down, x, norm), apart, rtol=0, atol=0.05 * apart.abs().max().item())
    else:
        assert torch.equal(up.swiglu(down, x, norm), apart)


@torch.no_grad()
def test_dense_layers_equal_the_widened_product():
    w = weights()
    x = rows(5)
    layer = DenseLinear(K, N)
    layer.weight.data = w
    assert torch.equal(layer(x), torch.nn.functional.linear(x, w))
    for half in (torch.bfloat16, torch.float16):
        held = dense_linear(w.to(half), torch.float32)
        assert type(held) is HalfCpuLinear and held.weight.dtype == half
        assert torch.equal(held(x), x @ w.to(half).float().T)  # widened exactly where it is read
    emb = DenseEmbedding(50, K)
    idx = torch.tensor([[3, 0, 49]])
    assert torch.equal(emb(idx), emb.weight[idx])


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
def test_the_16_bit_layer_runs_the_avx2_product_in_a_compiled_step():
    w = weights().bfloat16()
    layer = dense_linear(w, torch.float32)
    x = rows(1)
    fn = torch.compile(lambda x: layer(x), fullgraph=True, dynamic=True)
    with torch.profiler.profile() as prof:
        y = fn(x)
    assert any(e.name == "tinyllm_cpu::mm_half" for e in prof.events())
    torch.testing.assert_close(y, x @ w.float().T, rtol=1e-5, atol=1e-5)


def test_what_the_native_step_reads_of_each_layer():
    qt = quantize(weights(), "int4", 32)
    dense = dense_linear(weights().bfloat16(), torch.float32)
    w, s, z = dense.native_parts()
    assert torch.equal(w, dense.weight) and s.numel() == z.numel() == 0
    emb = QuantEmbedding(qt, torch.float32)
    assert [t is u for t, u in zip(emb.native_parts(), (emb.qweight, emb.scales, emb.zeros), strict=True)] == [True] * 3
    if cpu_qgemv.available():
        layer = CpuQgemvLinear(qt, torch.float32)
        assert all(t is u for t, u in zip(layer.native_parts(), (layer.qweight, layer.scales, layer.zeros), strict=True))
    for other in (DequantLinear(qt, torch.float32), Int4PackLinear(qt, torch.float32)):
        with pytest.raises(ValueError, match="quantized for another kernel"):
            other.native_parts()
    with pytest.raises(ValueError, match="a DenseLinear the native step does not run"):
        dense_linear(weights().double(), torch.float64).native_parts()


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("fbgemm", [True, False])
def test_the_factory_picks_the_class_per_device_dtype_and_form(monkeypatch, kernel, fbgemm):
    """kernel_for's table (tinyllm.core.quant_linear's docstring), on every device kind, with and
    without the AVX2 kernel and fbgemm; asked only where the answer matters (a CPU in fp32)."""
    asked = []
    monkeypatch.setattr(cpu_qgemv, "available", lambda: asked.append(1) or kernel)
    monkeypatch.setattr(quant, "fbgemm_available", lambda: fbgemm)
    int8, int4 = quantize(weights(), "int8"), quantize(weights(), "int4", 32)
    odd4 = quantize(weights(40, K), "int4", 32)  # N not a multiple of 16
    f32, bf16 = torch.float32, torch.bfloat16
    cpu_fp32 = CpuQgemvLinear if kernel else None
    assert kernel_for(int8, f32, CPU) is (cpu_fp32 or (FbgemmLinear if fbgemm else Int8PackLinear))
    assert kernel_for(int4, f32, CPU) is (cpu_fp32 or Int4PackLinear)
    assert kernel_for(odd4, f32, CPU) is (cpu_fp32 or DequantLinear)
    asked.clear()
    assert kernel_for(int8, bf16, CPU) is Int8PackLinear
    assert kernel_for(int4, bf16, CPU) is Int4PackLinear
    assert kernel_for(odd4, bf16, CPU) is DequantLinear
    for triton in (True, False):
        monkeypatch.setattr(qgemv, "available", lambda triton=triton: triton)
        for qt in (int8, int4, odd4):
            assert kernel_for(qt, bf16, CUDA) is (TritonLinear if triton else DequantLinear)
            assert kernel_for(qt, bf16, META) is DequantLinear
    assert asked == []  # no AVX2 kernel built for a layer that could not use it
    layer = quant_linear(int8, f32)
    assert type(layer) is kernel_for(int8, f32, CPU) and layer.dtype == f32


def test_the_dense_factory_keeps_16_bit_matrices_only_for_a_cpu_in_fp32():
    w = torch.nn.Parameter(weights().bfloat16())
    assert type(dense_linear(w, torch.float32)) is HalfCpuLinear
    assert dense_linear(w, torch.float32).weight is w  # the very Parameter: a tied lm_head shares it
    assert type(dense_linear(w, torch.bfloat16)) is DenseLinear
    assert type(dense_linear(weights(), torch.float32)) is DenseLinear
    assert type(dense_linear(torch.empty(N, K, dtype=torch.bfloat16, device=META), torch.float32)) is DenseLinear


@torch.no_grad()
def test_the_build_makes_each_matrix_the_layer_of_its_kernel():
    dense = tiny_model(tie_embeddings=True, ffn_dim=192)
    state = {k: v.bfloat16() for k, v in dense.state_dict().items()}
    held = build_transformer(dense.cfg, state, CPU, torch.float32, "auto")
    assert type(held.blocks[0].attn.wqkv) is HalfCpuLinear and type(held.tok_emb) is DenseEmbedding
    assert held.lm_head.weight is held.tok_emb.weight  # tied: one Parameter
    wide = build_transformer(dense.cfg, state, CPU, torch.float32, "none")
    assert type(wide.blocks[0].ffn.w2) is DenseLinear and wide.blocks[0].ffn.w2.weight.dtype == torch.float32
    ids = torch.randint(0, dense.cfg.vocab_size, (1, 12))
    assert torch.equal(held(ids)[0], wide(ids)[0])
    for kind in ("int8", "int4"):
        model = quantize_model(dense, kind)
        want = kernel_for(model.blocks[0].ffn.w2.qtensor(), torch.float32, CPU)
        assert {type(m) for m in (model.blocks[0].attn.wqkv, model.blocks[1].ffn.w2, model.lm_head)} == {want}
        assert type(model.tok_emb) is QuantEmbedding
        if want is CpuQgemvLinear:  # tied: the kernel reads the embedding's own bytes
            assert model.lm_head.qweight.data_ptr() == model.tok_emb.qweight.data_ptr()
