"""GGUF matrices kept quantized (gguf_quants.to_qtensor, load_gguf(quant="keep")), each type
against gguf.quants' reference dequantization."""

import numpy as np
import pytest
import torch

from tests.tinyllm.test_gguf import llama_file, sp_tok  # noqa: F401 (fixtures)
from tinyllm.core.quant import QTensor
from tinyllm.core.quant_linear import QuantEmbedding, QuantLinear
from tinyllm.formats.gguf_quants import to_qtensor
from tinyllm.formats.open_model import open_any

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
F16_AT = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q2_K: [80, 82],
          Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
INT4 = (Q.Q4_0, Q.Q4_1, Q.Q4_K)  # the same 4-bit values: exact


def random_blocks(qtype, rows=16, blocks=2, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, blocks * size), dtype=np.uint8)
    for off in F16_AT[qtype]:  # sane fp16 scales (random bytes may be NaN/inf)
        for b in range(blocks):
            raw[:, b * size + off:b * size + off + 2] = (
                rng.uniform(-1, 1, rows).astype(np.float16).view(np.uint8).reshape(rows, 2))
    return raw


@pytest.mark.parametrize("qtype", list(F16_AT), ids=lambda q: q.name)
def test_each_type_loads_as_its_quantized_form(qtype):
    raw = random_blocks(qtype)
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    shape = (16, 2 * block)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))  # (16, K)
    qt = to_qtensor(torch.from_numpy(raw.copy()), int(qtype), shape)
    assert isinstance(qt, QTensor) and qt.shape == shape
    err = (qt.dequantize() - ref).abs()
    if qtype in INT4:
        assert qt.kind == "int4" and qt.group == 32
        assert (err <= 1e-6 * ref.abs().amax(1, keepdim=True) + 1e-7).all(), float(err.max())
    else:  # int8 per row from the fp32 values: at most half a step of each row
        assert qt.kind == "int8"
        assert (err <= ref.abs().amax(1, keepdim=True) / 254 * 1.0001).all(), float(err.max())


def test_plain_types_stay_dense():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float16)
    out = to_qtensor(torch.from_numpy(x.view(np.uint8).copy()), int(Q.F16), (4, 64))
    assert isinstance(out, torch.Tensor) and torch.equal(out, torch.from_numpy(x.astype(np.float32)))


def test_gguf_file_loads_quantized_and_follows_the_file(llama_file, monkeypatch):  # noqa: F811
    path, _model, expected = llama_file
    dense = open_any(path, "cpu", torch.float32, quant="none")[0]
    fast = open_any(path, "cpu", torch.float32, quant="keep")[0]  # fbgemm for int8 where present
    monkeypatch.setattr("tinyllm.core.quant.fbgemm_available", lambda: False)
    model = open_any(path, "cpu", torch.float32, quant="keep")[0]  # weight-only kernels
    assert isinstance(model.tok_emb, QuantEmbedding) and model.tok_emb.kind == "int8"  # Q8_0
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.kind == "int8"  # Q6_K
    wo = model.blocks[0].attn.wo  # Q4_0 -> int4, the same values, Q/K un-permutation not involved
    assert isinstance(wo, QuantLinear) and wo.kind == "int4"
    torch.testing.assert_close(wo.qtensor().dequantize(), expected["blocks.0.attn.wo.weight"][0], rtol=1e-6,
                               atol=1e-6)
    wq = model.blocks[1].attn.wqkv  # Q6_K, Q4_K, Q8_0: mixed forms fuse as int8
    assert wq.kind == "int8"
    assert model.blocks[1].ffn.w2.kind == "int4"  # Q4_K
    idx = torch.randint(0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b, c = dense(idx)[0], model(idx)[0], fast(idx)[0]  # (B, T, V)
    # This file's fused groups mix types, so they are requantized to int8 per row: within 8% of
    # the logits' range. fbgemm also quantizes activations per tensor (7 bits): within 25% on
    # this deliberately rough random model (std 0.1 weights), the price of its speed.
    assert (a - b).abs().max() < 0.08 * a.abs().max()
    assert (a - c).abs().max() < 0.25 * a.abs().max()


def test_gguf_q_and_k_rows_are_unpermuted_in_quantized_form(llama_file):  # noqa: F811
    path, _model, expected = llama_file
    model = open_any(path, "cpu", torch.float32, quant="keep")[0]
    qkv = model.blocks[0].attn.wqkv.qtensor().dequantize()  # Q4_K, F16, BF16: int8 rows
    ref = torch.cat([expected[f"blocks.0.attn.{n}.weight"][0] for n in ("wq", "wk", "wv")])
    assert (qkv - ref).abs().max() <= ref.abs().amax(1).max() / 254 * 1.0001
