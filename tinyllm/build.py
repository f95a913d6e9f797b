"""The assembly under every model format: from a config and named tensors to a Transformer.

Each format (checkpoint.py, hf.py, gguf.py) reads its own files into tinyllm's names (the
separate `attn.wq/wk/wv`, `ffn.w1/w3`) and tinyllm.model_format hands them down here; the
device, dtype and quant rule is tinyllm.load_policy's, each matrix's form
tinyllm.matrix_forms'. This module owns the assembly:
- `build_transformer(cfg, state, device, dtype, quant, group, forms, half)`: state values are
  dense tensors or `QTensor`s; `quant` as tinyllm.quant_rule states it ("auto" resolved by
  load_policy.holding for the device and the forms `state` holds), `forms` and `half` as
  matrix_forms.hold_matrices reads them. A dense matrix is held in
  `load_policy.matrix_dtype`'s dtype, norms in `dtype`; quantized ones in QuantLinear /
  QuantEmbedding computing in `dtype`; tied embeddings share one tensor (or one QTensor).
  It runs `check_finite` first, so every format gets it. The model is in eval mode.
- `quantize_model(model, quant, group)`: the same, from a dense model in memory.
Refuses with one line (ValueError): an unknown quant, a weight that is not finite (naming the
tensor).
"""

from __future__ import annotations

import torch

from tinyllm.load_policy import check_quant, holding, matrix_dtype, stored_forms
from tinyllm.matrix_forms import FUSED, hold_matrices
from tinyllm.model import ModelConfig, Transformer
from tinyllm.quant import QTensor, QuantEmbedding, QuantLinear
from tinyllm.tensor_checks import check_finite


def build_transformer(cfg: ModelConfig, state: dict[str, torch.Tensor | QTensor], device: torch.device,
                      dtype: torch.dtype, quant: str = "auto", group: int = 32, forms: dict[str, str] | None = None,
                      half: bool = False) -> Transformer:
    """A Transformer holding `state` (tinyllm's separate names; lm_head from tok_emb when tied),
    its matrices as `quant`, `forms` and `half` say (the module docstring)."""
    check_quant(quant, group)
    forms = forms or {}
    for form in forms.values():
        check_quant(form, group)
    check_finite(state)
    device = torch.device(device)
    hold = holding(device, quant, stored_forms(state.values()), dtype)
    state = dict(state)
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    mats = hold_matrices(cfg, state, hold.quant, hold.int4_as, group, forms, half)
    dense = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}  # norms
    quantized: dict[str, QTensor] = {}
    for k, v in mats.items():
        if isinstance(v, QTensor):
            quantized[k.removesuffix(".weight")] = v.map(lambda t: t.to(device))
        else:
            dense[k] = v.to(device=device, dtype=matrix_dtype(v.dtype, device, dtype, hold.quant))
    with torch.device("meta"):
        model = Transformer(cfg)
    for name, qt in quantized.items():
        parent, _, leaf = name.rpartition(".")
        module = QuantEmbedding(qt, dtype) if leaf == "tok_emb" else QuantLinear(qt, dtype)
        setattr(model.get_submodule(parent) if parent else model, leaf, module)
    if cfg.tie_embeddings:
        if "tok_emb" in quantized:
            model.lm_head = QuantLinear(quantized["tok_emb"], dtype)
        else:
            dense["lm_head.weight"] = dense["tok_emb.weight"]
    for fused, parts in FUSED.items():  # dense fused weights go in whole (the load hook splits names)
        for i in range(cfg.n_layers):
            key = f"blocks.{i}.{fused}.weight"
            if key in dense:
                rows = dense.pop(key).split([_rows(cfg, p) for p in parts])
                dense.update({f"blocks.{i}.{p}.weight": r for p, r in zip(parts, rows, strict=True)})
    result = model.load_state_dict(dense, strict=False, assign=True)
    assert not result.unexpected_keys, f"builder passed unknown tensors {result.unexpected_keys[:3]}"
    if cfg.tie_embeddings and "tok_emb" not in quantized:
        model.lm_head.weight = model.tok_emb.weight
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    assert not left, f"builder left tensors unset: {left[:3]}"
    model.rope.to(device)
    return model.eval()


def quantize_model(model: Transformer, quant: str, group: int = 32, forms: dict[str, str] | None = None,
                   half: bool = False) -> Transformer:
    """A dense model rebuilt with its matrices in `quant`'s form (`forms`' where a prefix names
    them: build_transformer), on its device, in its dtype."""
    state = model.state_dict()
    assert not any(k.endswith(".qweight") for k in state), "quantize_model takes a dense model"
    return build_transformer(model.cfg, {k: v.float() for k, v in state.items()}, model.device, model.dtype,
                             quant, group, forms, half)


def _rows(cfg: ModelConfig, part: str) -> int:
    kv = cfg.n_kv_heads * cfg.head_dim
    return {"attn.wq": cfg.n_heads * cfg.head_dim, "attn.wk": kv, "attn.wv": kv}.get(part, cfg.ffn_dim)


