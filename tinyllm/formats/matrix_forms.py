"""Each matrix of a model in the form a load holds it in: dense, int8 or int4 (tinyllm.core.quant).

Contract: `hold_matrices(cfg, state, quant, int4_as, group, forms, half)` pops every matrix
(tok_emb, lm_head unless tied, each block's seven projections) out of `state`, tinyllm's
names, and returns them in their forms with each block's wq/wk/wv fused into `attn.wqkv`
and w1/w3 into `ffn.w13` (row-concatenated, tinyllm.model's layout); what is left in
`state` is the norms. `quant` is resolved (tinyllm.formats.load_policy: never "auto"):
- "none": every matrix dense (a QTensor dequantized);
- "keep": as `state` holds it, a kept int4 matrix as `int4_as` says ("int8": requantized);
- "int8" / "int4": every matrix quantized to that form (int4 falls back to int8 for a matrix
  whose rows are not whole groups; a QTensor already in that form stays as it is);
`forms` {name prefix: "none" | "int8" | "int4"} gives the matrices under a prefix their own
form instead of `quant`'s, the longest prefix winning ({"tok_emb": "int8", "blocks.29.":
"int8"}); `half` rounds new int4 scales to fp16 (quant.quantize). A fused projection whose
parts differ in form is held as int8. Dense matrices keep their dtype (tinyllm.formats.build and
load_policy.matrix_dtype decide the dtype in memory).
"""

from __future__ import annotations

import torch

from tinyllm.core.quant import QTensor, cat, fits, quantize
from tinyllm.model import ModelConfig

FUSED = {"attn.wqkv": ("attn.wq", "attn.wk", "attn.wv"), "ffn.w13": ("ffn.w1", "ffn.w3")}
LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")


def hold_matrices(cfg: ModelConfig, state: dict[str, torch.Tensor | QTensor], quant: str, int4_as: str = "int4",
                  group: int = 32, forms: dict[str, str] | None = None, half: bool = False
                  ) -> dict[str, torch.Tensor | QTensor]:
    """The matrices popped from `state`, each in its form, fused (the module docstring)."""
    forms = forms or {}
    mats: dict[str, torch.Tensor | QTensor] = {}
    names = ["tok_emb.weight"] + ([] if cfg.tie_embeddings else ["lm_head.weight"])
    names += [f"blocks.{i}.{lin}.weight" for i in range(cfg.n_layers) for lin in LINEARS]
    for n in names:
        own = max(((p, f) for p, f in forms.items() if n.startswith(p)), default=("", quant))[1]
        t = _target(state.pop(n), own, group, half)
        if int4_as == "int8" and isinstance(t, QTensor) and t.kind == "int4":
            t = quantize(t.dequantize(), "int8")
        mats[n] = t
    for i in range(cfg.n_layers):
        for fused, parts in FUSED.items():
            mats[f"blocks.{i}.{fused}.weight"] = _fuse([mats.pop(f"blocks.{i}.{p}.weight") for p in parts])
    return mats


def _target(t: torch.Tensor | QTensor, quant: str, group: int, half: bool = False) -> torch.Tensor | QTensor:
    """One matrix in the form `quant` asks for (dense tensors stay as the file holds them until the end)."""
    if quant == "none":
        return t.dequantize() if isinstance(t, QTensor) else t
    if quant in ("auto", "keep"):
        return t
    shape = t.shape if isinstance(t, QTensor) else tuple(t.shape)
    kind = quant if fits(shape, quant, group) else "int8"
    if isinstance(t, QTensor) and t.kind == kind and (kind == "int8" or t.group == group):
        return t
    return quantize(t.dequantize() if isinstance(t, QTensor) else t, kind, group, half)


def _fuse(parts: list[torch.Tensor | QTensor]) -> torch.Tensor | QTensor:
    """Row-concatenate a fused projection; mixed forms become int8 (dense parts too)."""
    if all(not isinstance(p, QTensor) for p in parts):
        return torch.cat(parts)
    if all(isinstance(p, QTensor) for p in parts) and len({(p.kind, p.group) for p in parts}) == 1:
        return cat(parts)
    return cat([_target(p, "int8", 32) for p in parts])
