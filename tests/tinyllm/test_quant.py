"""Weight-only quantization (tinyllm.core.quant, tinyllm.formats.build): every kernel against the fp32
product with the dequantized matrix, the quantized model against the dense one, and a
quantized checkpoint saved and loaded back unchanged."""

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.core.linear import DenseLinear
from tinyllm.core.quant import fbgemm_available, pack_int4, quantize, unpack_int4
from tinyllm.core.quant_linear import CpuQgemvLinear, DequantLinear, QuantEmbedding, QuantLinear, quant_linear
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.formats.build import quantize_model
from tinyllm.formats.checkpoint import load_checkpoint, save_checkpoint
from tinyllm.kernels import cpu_qgemv
from tinyllm.tools.testing import make_tiny_tokenizer


def weights(n=96, k=128, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05  # (N, K)


def test_pack_unpack_int4_round_trip():
    q = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    assert pack_int4(q).shape == (7, 32)


@pytest.mark.parametrize("kind,group", [("int8", 32), ("int4", 32), ("int4", 64)])
def test_quantize_dequantize_within_half_a_step(kind, group):
    w = weights()
    qt = quantize(w, kind, group)
    err = (qt.dequantize() - w).abs()  # (N, K)
    if kind == "int8":
        bound = w.abs().amax(1, keepdim=True) / 254  # half a step of each row
    else:
        g = w.view(96, -1, group)
        bound = ((g.amax(-1) - g.amin(-1)) / 30).repeat_interleave(group, 1)  # half a step of each group
    assert (err <= bound * 1.0001 + 1e-9).all()
    assert qt.group == (128 if kind == "int8" else group) and qt.shape == (96, 128)
    assert quantize(qt.dequantize(), kind, group).dequantize().sub(qt.dequantize()).abs().max() < 1e-6  # idempotent


def test_int4_refuses_rows_that_are_not_whole_groups():
    with pytest.raises(ValueError, match="whole groups of 32"):
        quantize(weights(8, 48), "int4", 32)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("path", ["avx2", "fallback", "generic"])
def test_quant_linear_kernels_match_the_dequantized_product(kind, path, monkeypatch):
    """Each CPU path: the AVX2 kernel (where it builds), PyTorch's kernels (fbgemm / aten
    int4pack, the fallback without it), and the generic (CUDA) formulation."""
    if path == "avx2" and not cpu_qgemv.available():
        pytest.skip("no AVX2 kernel here")
    if path == "fallback":
        monkeypatch.setattr(cpu_qgemv, "available", lambda: False)
    qt = quantize(weights(), kind, 32)
    layer = DequantLinear(qt, torch.float32) if path == "generic" else quant_linear(qt, torch.float32)
    assert isinstance(layer, CpuQgemvLinear) == (path == "avx2")
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(3))  # (B, T, K)
    ref = x @ qt.dequantize().T  # (B, T, N)
    y = layer(x)
    assert y.shape == (3, 5, 96)
    if path == "avx2":
        # x is quantized to int8 in blocks of 32: each element within max|block| / 254
        step = x.abs().max() / 254
        assert (y - ref).abs().max() <= step * qt.dequantize().abs().sum(1).max() + 1e-5
        assert (y - ref).abs().max() < 0.01 * ref.abs().max()
    elif kind == "int8" and path == "fallback" and fbgemm_available():
        # fbgemm quantizes x to 8 bits per tensor (7 bits of range): error bounded by that step
        # (plus fp32 rounding: an unseeded x once came 1% over the bare bound)
        step = x.abs().max() / 127
        assert (y - ref).abs().max() <= 1.05 * step * qt.dequantize().abs().sum(1).max() + 1e-5
        assert (y - ref).abs().max() < 0.02 * ref.abs().max()
    else:
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    assert torch.equal(layer.qtensor().qweight, qt.qweight)  # the kernel layout gives the values back
    torch.testing.assert_close(layer.qtensor().scales, qt.scales)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_cuda_formulation_under_inductor_matches_eager(kind):
    """The generic (CUDA) form compiled on the CPU: the batch-1 fused reduction."""
    layer = DequantLinear(quantize(weights(), kind, 32), torch.float32)
    x = torch.randn(1, 1, 128)  # one row: the reduction path
    fn = torch.compile(lambda x: layer(x), fullgraph=True, dynamic=True)
    torch.testing.assert_close(fn(x), x @ layer.qtensor().dequantize().T, rtol=1e-4, atol=1e-5)


def test_the_cuda_formulation_of_many_bf16_rows_compiles():
    """Seven rows in bf16 (a compiled engine step on CUDA): Inductor's int8 weight-only pass
    rewrites this product, and failed with "AssertionError: Pointwise" (first seen on the H200)
    when the scales were converted to bf16 inside the graph."""
    qt = quantize(weights(), "int8", 32)
    layer = DequantLinear(qt, torch.bfloat16)
    x = torch.randn(1, 7, 128, dtype=torch.bfloat16)
    fn = torch.compile(lambda x: layer(x), fullgraph=True, dynamic=True)
    ref = x.float() @ qt.dequantize().T
    torch.testing.assert_close(fn(x).float(), ref, rtol=0, atol=0.02 * ref.abs().max().item())


def test_quant_embedding_rows():
    for kind in ("int8", "int4"):
        qt = quantize(weights(50, 64), kind, 32)
        emb = QuantEmbedding(qt, torch.float32)
        idx = torch.tensor([[3, 0, 49], [7, 7, 1]])
        torch.testing.assert_close(emb(idx), qt.dequantize()[idx])


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_model_logits_close_to_fp32(quant):
    dense = tiny_model(tie_embeddings=True, ffn_dim=192)
    model = quantize_model(dense, quant)
    assert isinstance(model.blocks[0].attn.wqkv, QuantLinear) and isinstance(model.tok_emb, QuantEmbedding)
    assert isinstance(model.lm_head, QuantLinear)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = dense(ids)[0], model(ids)[0]  # (B, T, V)
    # Stated tolerance: int8 within 3% of the logits' range, int4 (groups of 32) within 15%.
    tol = {"int8": 0.03, "int4": 0.15}[quant]
    assert (a - b).abs().max() < tol * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > {"int8": 0.9, "int4": 0.6}[quant]


def test_rows_that_are_not_whole_groups_fall_back_to_int8():
    model = quantize_model(tiny_model(), "int4")  # ffn_dim 172: w2 rows are not groups of 32
    assert model.blocks[0].ffn.w2.kind == "int8" and model.blocks[0].ffn.w13.kind == "int4"


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_checkpoint_saves_and_loads_unchanged(tmp_path, quant):
    model = quantize_model(tiny_model(tie_embeddings=True, ffn_dim=192), quant)
    tok = make_tiny_tokenizer(tmp_path / "tok")
    path = save_checkpoint(model, tok, tmp_path / "ckpt", shard_mb=0.05)  # shards too
    assert len(list(path.glob("model-*.safetensors"))) > 1
    a = model.state_dict()
    assert any(k.endswith(".qweight") for k in a)
    # Loaded with bf16 activations (CUDA's, and a CPU's with AVX512-BF16), the scales and
    # offsets are still the file's: they were held in bf16 once, and a checkpoint saved from
    # such a model was no longer the one loaded.
    for dtype in (None, torch.bfloat16):
        b = load_checkpoint(path, dtype=dtype, quant="keep").model.state_dict()
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (dtype, k)
    back = load_checkpoint(path, dtype=model.dtype, quant="keep").model
    ids = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        assert torch.equal(model(ids)[0], back(ids)[0])
    dense = load_checkpoint(path, quant="none").model  # dequantized on request
    assert type(dense.blocks[0].attn.wqkv) is DenseLinear


def test_checkpoint_with_a_bad_quantized_tensor_is_a_one_line_error(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(quantize_model(tiny_model(ffn_dim=192), "int4"), make_tiny_tokenizer(tmp_path / "t"),
                           tmp_path / "ckpt")
    state = load_file(path / "model.safetensors")
    state["blocks.0.attn.wq.scales"] = state["blocks.0.attn.wq.scales"][:, :1].contiguous()
    save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match="shape mismatch blocks.0.attn.wq"):
        load_checkpoint(path)


def plain_and_compiled(model, seed: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(plain, compiled) logits of the prefill of 10 random tokens, then of `steps` greedy
    steps, both decoders fed the plain one's token."""
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(seed))
    plain = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False)
    fast = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False, compile="inductor")
    out = [(plain.prefill(ids), fast.prefill(ids))]
    for _ in range(steps):
        tok = out[-1][0][:, -1].argmax(-1, keepdim=True)  # (1, 1)
        out.append((plain.step(tok), fast.step(tok)))
    return out


@torch.no_grad()
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_compiled_quantized_step_matches_its_eager_step(quant):
    pairs = plain_and_compiled(quantize_model(tiny_model(ffn_dim=192), quant), seed=2, steps=12)
    for a, b in pairs[:-1]:
        assert torch.equal(a[:, -1].argmax(-1), b[:, -1].argmax(-1))
    for a, b in pairs[1:]:
        # The CPU kernel rounds x to int8 (blocks of 32, as llama.cpp), so the compiled RMSNorm's
        # last-bit differences may move one of x's roundings: 1.6e-3 seen on an AVX512 CPU.
        torch.testing.assert_close(b, a, rtol=1e-4, atol=5e-3 if cpu_qgemv.available() else 1e-4)


def test_bench_reports_quantized_weight_bytes(capsys):
    import json

    from tinyllm.tools.bench import main

    assert main(["--preset", "tiny", "--device", "cpu", "--steps", "2", "--repeats", "1", "--quant", "int8",
                 "--prompt-lens", "16"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    w = next(r for r in recs if r["metric"] == "weights_mib")
    assert 0 < w["value"] < w["params"] * 4 / 2**20 / 3  # int8: under a third of fp32's bytes
    assert any(r["metric"] == "decode_tok_s" and r["quant"] == "int8" for r in recs)


def test_a_dense_model_loads_without_building_the_cpu_kernel(monkeypatch):
    """`quant="auto"` asks whether the AVX2 kernel builds (about 20 s of CPU the first time) only
    where an int4 matrix would need the answer: the default model's first load took 16.6 s
    instead of 1 s, building a kernel that a dense model never uses."""
    from tinyllm.formats.build import build_transformer

    asked = []
    monkeypatch.setattr(cpu_qgemv, "available", lambda: asked.append(1) or True)
    dense = tiny_model()
    state = {k: v.float() for k, v in dense.state_dict().items()}
    build_transformer(dense.cfg, dict(state), torch.device("cpu"), torch.float32, "auto")
    assert asked == []
    state["blocks.0.attn.wo.weight"] = quantize(state["blocks.0.attn.wo.weight"], "int4", 32)
    build_transformer(dense.cfg, state, torch.device("cpu"), torch.float32, "auto")
    assert asked


@torch.no_grad()
@pytest.mark.parametrize("k", [172, 176])
def test_int8_bf16_rows_on_cpu_match_the_dequantized_product(k):
    """bf16 activations (a CPU with AVX512-BF16 picks them for a quantized model), several rows,
    K not a multiple of 16: torch's int8 kernel crashed the process there; the layer must not
    call it, and still give the dequantized product."""
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(k)) * 0.05
    qt = quantize(w, "int8")
    layer = quant_linear(qt, torch.bfloat16)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = layer(x)
    ref = x.double() @ qt.dequantize(torch.float64).T
    assert y.dtype == torch.bfloat16 and ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


@torch.no_grad()
def test_compiled_int8_step_in_bf16_on_cpu():
    """A quantized model in bf16 on a CPU (a CPU with AVX512-BF16 picks bf16 for int4 models:
    load_policy.default_dtype; --dtype bf16 asks for it): the compiled int8 step failed in Inductor
    (AssertionError: Pointwise) while the scales were converted inside the graph. The compiled
    step must compile, and agree with the eager one."""
    model = quantize_model(tiny_model(ffn_dim=192).to(torch.bfloat16), "int8")
    assert model.dtype == torch.bfloat16
    for a, b in plain_and_compiled(model, seed=3, steps=6)[1:]:
        assert ((b.float() - a.float()).norm() / a.float().norm()).item() < 2e-2


def test_cpu_activations_are_fp32_unless_only_torchs_int4_kernel_is_there(monkeypatch):
    """load_policy.default_dtype's rule, measured (docs/BENCHMARKS-LOG.md): bf16 on CUDA;
    on a CPU fp32, except bf16 for a model holding int4 matrices where the CPU has native bf16
    and the AVX2 kernel cannot be built. holds_int4 answers for a load: int4 asked for, or int4
    matrices kept."""
    from tinyllm.formats import load_policy
    from tinyllm.kernels import cpu_qgemv

    cpu = torch.device("cpu")
    int4, int8 = quantize(torch.randn(8, 64), "int4", 32), quantize(torch.randn(8, 64), "int8")
    holds_int4, forms = load_policy.holds_int4, load_policy.stored_forms
    assert forms([int8, int4, torch.zeros(2)]) == {"int8", "int4"} and forms([torch.zeros(2)]) == set()
    assert holds_int4("int4", forms([])) and holds_int4("keep", forms([int8, int4]))
    assert holds_int4("auto", forms([int4]))
    assert not holds_int4("keep", forms([int8, torch.zeros(2)])) and not holds_int4("int8", forms([int4]))
    assert not holds_int4("none", forms([int4]))
    for native in (True, False):
        for kernel in (True, False):
            monkeypatch.setattr(load_policy, "cpu_has_bf16", lambda native=native: native)
            monkeypatch.setattr(cpu_qgemv, "available", lambda kernel=kernel: kernel)
            want = torch.bfloat16 if native and not kernel else torch.float32
            assert load_policy.default_dtype(cpu, int4=True) == want, (native, kernel)
            assert load_policy.default_dtype(cpu, int4=False) == torch.float32

def test_forms_and_half_scales_shape_a_mixed_checkpoint(tmp_path):
    """convert --quant int4 --form tok_emb=int8 --form blocks.1.=int8 --half-scales: the int4
    matrices keep fp16 scales and offsets (0.625 bytes a weight at group 32), saved as fp16,
    and every matrix is in the form its longest prefix names."""
    from safetensors import safe_open

    dense = tiny_model(tie_embeddings=True, ffn_dim=192)
    model = quantize_model(dense, "int4", 32, {"tok_emb": "int8", "blocks.1.": "int8", "blocks.1.ffn.w2": "int4"},
                           half=True)
    path = save_checkpoint(model, make_tiny_tokenizer(tmp_path / "tok"), tmp_path / "ckpt")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        held = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    assert held["tok_emb.qweight"].dtype == torch.int8 and held["blocks.1.attn.wq.qweight"].dtype == torch.int8
    assert held["blocks.1.ffn.w2.qweight"].dtype == torch.uint8  # the longer prefix wins
    assert held["blocks.0.ffn.w1.qweight"].dtype == torch.uint8
    assert held["blocks.0.ffn.w1.scales"].dtype == held["blocks.0.ffn.w1.zeros"].dtype == torch.float16
    assert held["tok_emb.scales"].dtype == torch.float32  # int8 per-row scales are not fp16-exact
    # Within a step of the dense weights (half a step plus the fp16 rounding of the offset).
    w = dense.blocks[0].ffn.w2.weight.detach()
    qt = quantize(w, "int4", 32, half=True)
    step = qt.scales.repeat_interleave(32, 1)
    assert ((qt.dequantize() - w).abs() <= 0.5 * step + 1e-3 * w.abs().amax()).all()
    back = load_checkpoint(path, quant="keep").model.state_dict()
    assert all(torch.equal(v, back[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_dequantizes_a_block_at_a_time_with_the_same_product(kind, dtype, monkeypatch):
    """DequantLinear over many rows (a prefill) dequantizes at most DEQUANT_BLOCK weights at a time:
    blocks of 40 output features of 64 inputs (7 blocks, the last short) give the product of the whole
    matrix dequantized at once, to the library product's rounding, and every output feature."""
    from tinyllm.core import quant_linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(263, 64, generator=g) * 0.1
    layer = DequantLinear(quantize(w, kind, 32), dtype)
    x = torch.randn(3, 5, 64, generator=g).to(dtype)  # (B, T, K): 15 rows
    whole = layer(x)
    monkeypatch.setattr(quant_linear, "DEQUANT_BLOCK", 40 * 64 + 7)  # 40 whole rows a block
    seen = []
    product = layer._product
    monkeypatch.setattr(layer, "_product", lambda x, n0, n1: seen.append((n0, n1)) or product(x, n0, n1))
    blocked = layer(x)
    assert seen == [(n, min(n + 40, 263)) for n in range(0, 263, 40)]
    assert blocked.shape == whole.shape == (3, 5, 263) and blocked.dtype == dtype
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(blocked, whole, **tol)
    want = x.float() @ layer.qtensor().dequantize().T  # the canonical form's product, fp32 (bf16: dequantized in bf16)
    far = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0, atol=5e-2)
    torch.testing.assert_close(blocked.float(), want, **far)


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_a_prefill_holds_no_dequantized_copy_of_a_whole_matrix():
    """A prompt's product on CUDA (more rows than the Triton kernels take) through an int4 matrix of 134M
    weights: its temporaries stay within twice one block's (about 6 bytes a weight of DEQUANT_BLOCK at
    the peak: the unpacked bytes, the bf16 values, the scaled ones; and cuBLAS's workspace) where the
    whole matrix dequantized takes about 900 MB."""
    from tinyllm.core.quant_linear import DEQUANT_BLOCK

    w = torch.randn(32768, 4096, device="cuda") * 0.05
    layer = quant_linear(quantize(w, "int4", 32), torch.bfloat16, torch.device("cuda"))
    del w
    x = torch.randn(1, 16, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = layer(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert y.shape == (1, 16, 32768) and peak < 16 * DEQUANT_BLOCK, peak
    torch.testing.assert_close(y[0, :, :64].float(), (x[0].float() @ layer.qtensor().dequantize()[:64].T),
                               rtol=0, atol=0.1)
