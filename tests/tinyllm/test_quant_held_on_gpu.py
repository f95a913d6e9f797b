"""Quantized weights stay quantized on the GPU (issue 50): the forms a GGUF's types are held in on
CUDA and the bytes each costs (CPU, no GPU needed: tinyllm.core.quant.half_scales, the shapes of
Llama-3.1-8B Q4_K_M on the meta device), and, with `-m cuda`, a GGUF opened with `--quant auto`
on CUDA kept in Triton's layers with logits as close as the bf16 load's."""

import numpy as np
import pytest
import torch

from tests.tinyllm.test_gguf import quantize, quantize_q4_k, sp_kv, sp_tok, write_gguf  # noqa: F401 (fixture)
from tests.tinyllm.test_quant_gguf import random_blocks
from tinyllm.core.linear import DenseLinear
from tinyllm.core.quant import QTensor, half_scales, held_exactly
from tinyllm.core.quant_linear import DequantLinear, QuantEmbedding, TritonLinear, quantized_bytes
from tinyllm.formats.gguf_quants import GGML_TYPES, held_form, to_qtensor
from tinyllm.formats.matrix_forms import hold_matrices
from tinyllm.model import ModelConfig, Transformer

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
K = 4096  # columns: Llama-3.1-8B's width
INT4 = (Q.Q4_0, Q.Q4_1, Q.Q4_K)  # exact as int4 in groups of 32; every other block type: int8 per row


def q4_k(rows: int, cols: int, std: float, seed: int = 0) -> QTensor:
    """A Q4_K matrix of weights with `std` (tests.test_gguf's writer), read as to_qtensor reads it."""
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * std).astype(np.float32)
    raw = quantize_q4_k(w.reshape(-1, 256)).reshape(-1)
    return to_qtensor(torch.from_numpy(raw.copy()), int(Q.Q4_K), (rows, cols))


def test_half_scales_rounds_q4_k_within_fp16s_rounding():
    """Q4_K's scales d sc and offsets -dmin mn are exact in fp32, mostly not in fp16: rounded, each
    moves by at most 2^-11 of itself, so a weight by at most 2^-11 (q |s| + |z|) (the bound
    half_scales states), and by at most 2% of its group's step (measured 1.1%)."""
    for std in (0.005, 0.02, 0.1):
        qt = q4_k(64, 1024, std)
        h = half_scales(qt)
        assert h.scales.dtype == h.zeros.dtype == torch.float16 and h.qweight is qt.qweight
        assert not torch.equal(h.scales.float(), qt.scales)  # rounded, not exact
        q = (qt.dequantize() - qt.zeros.repeat_interleave(32, 1)) / qt.scales.repeat_interleave(32, 1)  # (N, K)
        s, z = (t.abs().repeat_interleave(32, 1) for t in (qt.scales, qt.zeros))
        moved = (h.dequantize() - qt.dequantize()).abs()
        assert (moved <= 2**-11 * (q.round() * s + z) * 1.0001 + 1e-12).all()
        assert (moved <= 0.02 * s).all(), float((moved / s).max())


def test_half_scales_keeps_exact_values_and_refuses_what_fp16_cannot_hold():
    raw = torch.from_numpy(random_blocks(Q.Q4_1, rows=8, blocks=4).copy())
    q41 = to_qtensor(raw, int(Q.Q4_1), (8, 128))  # fp16 pairs already: exact
    h = half_scales(q41)
    assert h.scales.dtype == torch.float16 and torch.equal(h.dequantize(), q41.dequantize())
    big = QTensor("int4", q41.qweight, q41.scales * 1e6, q41.zeros)  # past fp16's range
    tiny = QTensor("int4", q41.qweight, q41.scales, q41.zeros * 1e-7 + 1e-9)  # subnormal in fp16: not close
    for qt in (big, tiny):
        h = half_scales(qt)
        assert torch.equal(h.scales.float(), qt.scales) and torch.equal(h.zeros.float(), qt.zeros)
    int8 = QTensor("int8", torch.zeros(4, 64, dtype=torch.int8), torch.rand(4) + 0.1)
    assert half_scales(int8) is int8
    fp16 = torch.rand(5).half()
    assert held_exactly(fp16) is fp16  # shared (a tied table's scales), not copied


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q5_K, Q.Q6_K],
                         ids=lambda q: q.name)
def test_bytes_each_gguf_type_is_held_in_on_cuda(qtype):
    """Bits a weight, file against CUDA (build: half_scales, then the layer; the layer here is the
    CPU's DequantLinear, TritonLinear's base, which holds the same buffers): int4 in groups of 32
    with fp16 scale and offset, 5 bits (Q4_0 4.5, Q4_1 5, Q4_K 4.5 in the file); every other type
    int8 per row, 8 bits and a scale a row (Q6_K 6.56, Q5_K 5.5, Q8_0 8.5 in the file)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = torch.from_numpy(random_blocks(qtype, rows=8, blocks=K // block).copy())
    qt = half_scales(to_qtensor(raw, int(qtype), (8, K)))
    layer = DequantLinear(qt, torch.bfloat16)
    bits = quantized_bytes(layer) * 8 / (8 * K)
    file_bits = size * 8 / block
    assert GGML_TYPES[int(qtype)][1:] == (block, size)
    if qtype in INT4:
        assert qt.kind == "int4" and bits == 5.0, (bits, file_bits)
    else:  # int8: the weights, an fp32 scale and (DequantLinear's act_scales) a bf16 one a row
        assert qt.kind == "int8" and bits == 8 + (32 + 16) / K, (bits, file_bits)


# ---- Llama-3.1-8B Q4_K_M, shapes only ----------------------------------------------------

LLAMA_8B = ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                       max_seq_len=8192, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False)
LINEARS = {"attn.wq": "attn_q", "attn.wk": "attn_k", "attn.wv": "attn_v", "attn.wo": "attn_output",
           "ffn.w1": "ffn_gate", "ffn.w3": "ffn_up", "ffn.w2": "ffn_down"}


def q4_k_m_types(n_layers: int) -> dict[str, int]:
    """llama.cpp's Q4_K_M (llama-quant.cpp, llama_tensor_get_type): Q4_K, but output Q6_K, and
    attn_v and ffn_down Q6_K in the layers use_more_bits picks."""
    def more_bits(i: int) -> bool:
        return i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2

    types = {"tok_emb.weight": Q.Q4_K, "lm_head.weight": Q.Q6_K}
    for i in range(n_layers):
        for lin in LINEARS:
            big = lin in ("attn.wv", "ffn.w2") and more_bits(i)
            types[f"blocks.{i}.{lin}.weight"] = Q.Q6_K if big else Q.Q4_K
    return types


def meta_qtensor(typ: int, shape: tuple[int, int]) -> QTensor:
    """to_qtensor's output for this type and shape, with no data."""
    n, k = shape
    if held_form(typ, shape) == "int4":
        return QTensor("int4", torch.empty(n, k // 2, dtype=torch.uint8, device="meta"),
                       torch.empty(n, k // 32, device="meta"), torch.empty(n, k // 32, device="meta"))
    return QTensor("int8", torch.empty(n, k, dtype=torch.int8, device="meta"), torch.empty(n, device="meta"))


def cuda_bytes(qt: QTensor) -> int:
    """Bytes build holds `qt` in on CUDA: int4 scales and offsets fp16 (half_scales: Q4_K's
    always are, test above), an int8 row's scale fp32."""
    half = 2 if qt.kind == "int4" else 4
    return qt.qweight.numel() + sum(t.numel() * half for t in (qt.scales, qt.zeros) if t is not None)


def test_llama_8b_q4_k_m_bytes_on_cuda_against_the_file_and_llama_cpp():
    """The weights tinyllm holds on CUDA for Llama-3.1-8B Q4_K_M under auto (matrix_forms'
    fusion and forms, on the meta device) against the GGUF's tensor bytes and llama.cpp's VRAM
    for them (-ngl 99: every tensor but token_embd, which llama.cpp keeps on the host).
    4,913 MB in the file, 4,617 MB (4403.5 MiB) on llama.cpp's GPU, 5,721 MB ours: 1.164x the
    file, 1.239x llama.cpp. What is over the issue's 1.15x: the token table on the GPU (328 MB;
    llama.cpp keeps it on the host), Q6_K held as int8 (8 bits against 6.56: 94 MB of output
    and 169 MB of ffn_down), and each wqkv fusing a Q6_K attn_v with Q4_K q and k held whole as
    int8 (126 MB in 16 layers). With Q4_K's scales in fp32 (held_exactly, before half_scales)
    it was 6,491 MB (1.41x llama.cpp); held dense in bf16 (auto on CUDA before) 16,061 MB."""
    cfg, types = LLAMA_8B, q4_k_m_types(LLAMA_8B.n_layers)
    shapes = {"tok_emb.weight": (cfg.vocab_size, cfg.dim), "lm_head.weight": (cfg.vocab_size, cfg.dim)}
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    rows = {"attn.wq": q, "attn.wk": kv, "attn.wv": kv, "attn.wo": cfg.dim, "ffn.w1": cfg.ffn_dim,
            "ffn.w3": cfg.ffn_dim, "ffn.w2": cfg.dim}
    cols = {"attn.wo": q, "ffn.w2": cfg.ffn_dim}
    for i in range(cfg.n_layers):
        for lin in LINEARS:
            shapes[f"blocks.{i}.{lin}.weight"] = (rows[lin], cols.get(lin, cfg.dim))
    state = {n: meta_qtensor(int(types[n]), s) for n, s in shapes.items()}
    mats = hold_matrices(cfg, state, "keep")
    norms = (2 * cfg.n_layers + 1) * cfg.dim  # values; f32 in the file, bf16 here
    ours = sum(cuda_bytes(m) for m in mats.values()) + 2 * norms
    _, block, size = GGML_TYPES[int(Q.Q4_K)]
    emb = cfg.vocab_size * cfg.dim // block * size
    file = sum(np.prod(s) // GGML_TYPES[int(types[n])][1] * GGML_TYPES[int(types[n])][2] for n, s in shapes.items())
    file += 4 * norms
    llama_cpp = file - emb
    mixed = [i for i in range(cfg.n_layers) if types[f"blocks.{i}.attn.wv.weight"] == Q.Q6_K]
    assert len(mixed) == 16 and all(mats[f"blocks.{i}.attn.wqkv.weight"].kind == "int8" for i in mixed)
    assert mats["tok_emb.weight"].kind == "int4" and mats["lm_head.weight"].kind == "int8"
    assert round(file / 1e6) == 4913 and round(llama_cpp / 2**20, 1) == 4403.5 and round(ours / 1e6) == 5721
    assert round(ours / file, 3) == 1.164 and round(ours / llama_cpp, 3) == 1.239


# ---- on the GPU (run with -m cuda) --------------------------------------------------------

LAYERS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")
FILES = {  # tied, every matrix an exact int4 form; untied, Q8_0 table, Q6_K output, int8 forms and an F16 matrix
    "int4-tied": {"tok_emb.weight": Q.Q4_K, **{f"blocks.{i}.{k}.weight": t for i, ts in enumerate([
        (Q.Q4_K, Q.Q4_K, Q.Q4_K, Q.Q4_0, Q.Q4_K, Q.Q4_K, Q.Q4_1),
        (Q.Q4_0, Q.Q4_0, Q.Q4_0, Q.Q4_K, Q.Q4_1, Q.Q4_1, Q.Q4_K)]) for k, t in zip(LAYERS, ts, strict=True)}},
    "mixed-untied": {"tok_emb.weight": Q.Q8_0, "lm_head.weight": Q.Q6_K, **{
        f"blocks.{i}.{k}.weight": t for i, ts in enumerate([
            (Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q6_K, Q.Q4_K, Q.Q4_K, Q.Q8_0),
            (Q.Q6_K, Q.Q6_K, Q.Q6_K, Q.Q4_K, Q.Q5_0, Q.Q5_0, Q.F16)]) for k, t in zip(LAYERS, ts, strict=True)}},
}


def smooth_model(vocab: int, tie: bool) -> Transformer:
    """Weights of std 0.05 and norms near 1 (test_gguf.tiny's 0.1 and 0.3 double bf16's error)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512,
                      max_seq_len=128, rope_theta=50000.0, norm_eps=1e-5, tie_embeddings=tie)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05) + (1.0 if p.dim() == 1 else 0.0))
    return model


def decoded(model: Transformer, seq: torch.Tensor) -> torch.Tensor:
    """Logits (1, T - 4, V) of seq's positions 4.. as the decoder makes them: a prefill of 4 rows
    (at most qgemv.MAX_ROWS: Triton's kernels too), then one graph replay a token."""
    from tinyllm.cuda_graph import GraphDecoder

    dec = GraphDecoder(model, 1, max_len=64, buckets=(16, 32, 64), use_graph=True, compile=None)
    dec.prefill(seq[:, :4])
    return torch.cat([dec.step(seq[:, i:i + 1]).clone() for i in range(4, seq.shape[1])], 1).float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


@pytest.mark.cuda
@torch.no_grad()
@pytest.mark.parametrize("name", list(FILES))
def test_a_gguf_stays_quantized_on_cuda_under_auto(tmp_path, sp_tok, name):  # noqa: F811
    """auto on CUDA: every int4 / int8 matrix a TritonLinear (int4 scales and offsets fp16), the
    table a QuantEmbedding that a tied lm_head reads in place, an F16 matrix dense in bf16; the
    decoded logits within bf16's tolerance of the `--quant none` load's. Measured on the CPU in
    bf16, dequantizing in fp32 as Triton's kernels do: 0.013 for the int4 file (and 0.0139
    from its fp32 logits, the bf16 load 0.0136), 0.029 for the mixed one, whose int8 forms are
    requantized per row."""
    from tinyllm.formats.open_model import open_any

    tie = name == "int4-tied"
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, smooth_model(sp_tok.vocab_size, tie), FILES[name], sp_kv(sp_tok))
    kept = open_any(path, "cuda").model  # --quant auto, the default
    dense = open_any(path, "cuda", quant="none").model
    assert isinstance(kept.tok_emb, QuantEmbedding) and isinstance(kept.lm_head, TritonLinear)
    assert kept.tok_emb.kind == ("int4" if tie else "int8") and kept.lm_head.kind == ("int4" if tie else "int8")
    for b in kept.blocks:
        for layer in (b.attn.wqkv, b.attn.wo, b.ffn.w13, b.ffn.w2):
            if isinstance(layer, DenseLinear):  # the mixed file's F16 ffn_down
                assert not tie and layer is kept.blocks[1].ffn.w2 and layer.weight.dtype == torch.bfloat16
                continue
            assert isinstance(layer, TritonLinear), type(layer)
            if layer.kind == "int4":
                assert layer.scales.dtype == layer.zeros.dtype == torch.float16
    if tie:  # one table: the lm_head reads the embedding's bytes, and the model holds them once
        for t in ("qweight", "scales", "zeros"):
            assert getattr(kept.lm_head, t).data_ptr() == getattr(kept.tok_emb, t).data_ptr(), t
        assert quantized_bytes(kept) < 0.35 * quantized_bytes(dense)  # 5 bits a weight against 16
    seq = torch.randint(3, sp_tok.vocab_size, (1, 28), generator=torch.Generator().manual_seed(0)).cuda()
    a, b = decoded(kept, seq), decoded(dense, seq)
    assert rel(a, b) < 0.05, rel(a, b)
    if tie:  # the same values as the file's: as close to its fp32 logits as the bf16 load, within 2x
        ref = open_any(path, "cpu", torch.float32, quant="none").model(seq.cpu())[0][:, 4:]
        assert rel(a, ref) <= 2 * rel(b, ref) + 0.005, (rel(a, ref), rel(b, ref))
