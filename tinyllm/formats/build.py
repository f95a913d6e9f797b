"""The assembly under every model format: from a config and named tensors to a Transformer.

Each format (checkpoint.py, hf.py, gguf.py) reads its own files into tinyllm's names (the
separate `attn.wq/wk/wv`, `ffn.w1/w3`) and tinyllm.formats.model_format hands them down here; the
device, dtype and quant rule is tinyllm.formats.load_policy's, each matrix's form
tinyllm.formats.matrix_forms'. This module owns the assembly:
- `build_transformer(cfg, state, device, dtype, quant, group, forms, half)`: state values are
  dense tensors or `QTensor`s; `quant` as tinyllm.formats.quant_rule states it ("auto" resolved by
  load_policy.holding for the device and the forms `state` holds), `forms` and `half` as
  matrix_forms.hold_matrices reads them. A dense matrix is held in
  `load_policy.matrix_dtype`'s dtype, norms in `dtype`; each matrix is the layer of the kernel
  that runs it here, picked once (tinyllm.core.linear.dense_linear, tinyllm.core.quant_linear.quant_linear;
  the embedding a DenseEmbedding or QuantEmbedding), computing in `dtype`; tied embeddings
  share one tensor (or one QTensor's: the lm_head reads the table the embedding looks up). On
  CUDA an int4 matrix's scales and offsets are held in fp16 (tinyllm.core.quant.half_scales:
  rounded where not exact, never by more than fp16 rounds; Q4_K's 6 bits a weight become 5),
  since there a decode step's speed is its bytes; a CPU holds them exactly (held_exactly).
  It runs `check_finite` first, so every format gets it. The model is in eval mode.
- `quantize_model(model, quant, group)`: the same, from a dense model in memory.
Refuses with one line (ValueError): an unknown quant, a weight that is not finite (naming the
tensor).
"""

from __future__ import annotations

import torch
from torch import nn

from tinyllm.core.linear import dense_embedding, dense_linear
from tinyllm.core.quant import QTensor, half_scales
from tinyllm.core.quant_linear import QuantEmbedding, quant_linear
from tinyllm.formats.load_policy import check_quant, holding, matrix_dtype, stored_forms
from tinyllm.formats.matrix_forms import hold_matrices
from tinyllm.formats.tensor_checks import check_finite
from tinyllm.model import ModelConfig, Transformer


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
    norms = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    with torch.device("meta"):
        model = Transformer(cfg)
    held: dict[str, nn.Parameter | QTensor] = {}  # each matrix on the device, as the layer holds it
    for key, v in mats.items():
        if isinstance(v, QTensor):
            held[key] = (half_scales(v) if device.type == "cuda" else v).map(lambda t: t.to(device))
        else:
            held[key] = nn.Parameter(v.to(device=device, dtype=matrix_dtype(v.dtype, device, dtype, hold.quant)))
    if cfg.tie_embeddings:  # one tensor (or one QTensor's) for both
        held["lm_head.weight"] = held["tok_emb.weight"]
    for key, m in held.items():  # each matrix as the layer of the kernel that runs it
        parent, _, leaf = key.removesuffix(".weight").rpartition(".")
        if leaf == "tok_emb":
            layer = QuantEmbedding(m, dtype) if isinstance(m, QTensor) else dense_embedding(m)
        else:
            layer = quant_linear(m, dtype, device) if isinstance(m, QTensor) else dense_linear(m, dtype)
        setattr(model.get_submodule(parent) if parent else model, leaf, layer)
    result = model.load_state_dict(norms, strict=False, assign=True)
    assert not result.unexpected_keys, f"builder passed unknown tensors {result.unexpected_keys[:3]}"
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    assert not left, f"builder left tensors unset: {left[:3]}"
    model.follow_weights()
    return model.eval()


def quantize_model(model: Transformer, quant: str, group: int = 32, forms: dict[str, str] | None = None,
                   half: bool = False) -> Transformer:
    """A dense model rebuilt with its matrices in `quant`'s form (`forms`' where a prefix names
    them: build_transformer), on its device, in its dtype."""
    state = model.state_dict()
    assert not any(k.endswith(".qweight") for k in state), "quantize_model takes a dense model"
    return build_transformer(model.cfg, {k: v.float() for k, v in state.items()}, model.device, model.dtype,
                             quant, group, forms, half)
