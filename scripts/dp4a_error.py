"""What rounding x to int8 costs in logits on real models (issue 50: the dp4a int4 product,
tinyllm.kernels.qgemv_dp4a), beside what bf16 already costs: a full forward over the first N
tokens of a text, teacher-forced, on the CPU in fp32, each product as its slow twin computes it:
- "exact": every product x @ W.T with W dequantized (the plain CUDA step's int4 and int8 products,
  to fp32 rounding);
- "dp4a": the same, but each int4 matrix of groups of 32 takes x rounded as quantize_x rounds it
  (qgemv_dp4a.reference: groups of 32 on their own scale max|x| / 127): what TINYLLM_INT4_DP4A=1
  computes on CUDA (int8 matrices keep x as it is there);
- "bf16": the whole model in bf16, every matrix dense (quant none), x as it is: the difference
  the CUDA step already lives with, since it runs in bf16.
Each against "exact": the largest and mean absolute logit difference, the teacher-forced top-1
agreement, and the mean KL divergence of the next-token distributions. One JSON line a model.

    .venv/bin/python scripts/dp4a_error.py [--tokens 400] MODEL [MODEL ...]
"""

import argparse
import json
import sys
import types
from pathlib import Path

import torch

from tinyllm.core.linear import Linear
from tinyllm.core.quant_linear import QuantLinear
from tinyllm.formats.open_model import open_any

TEXT = Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"
GROUP = 32


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) rounded as qgemv_dp4a.quantize_x rounds it, back in fp32 (its `reference`)."""
    groups = x.float().reshape(*x.shape[:-1], -1, GROUP)  # (..., K/32, 32)
    d = groups.abs().amax(-1, keepdim=True) / 127.0
    return (torch.floor(groups * (1.0 / d.clamp_min(1e-30)) + 0.5) * d).reshape(x.shape)


def as_twins(model: torch.nn.Module, round_int4: bool) -> list[str]:
    """Every quantized layer's forward as its slow twin (x, or x rounded for int4 of groups of
    32 where round_int4) @ W.dequantize().T; returns the names of the layers whose x is rounded."""
    names = []
    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear):
            continue
        w = m.qtensor().dequantize(torch.float32)  # (N, K)
        rnd = round_int4 and m.kind == "int4" and m.group == GROUP
        if rnd:
            names.append(name)

        def forward(x, w=w, rnd=rnd):
            return (rounded(x) if rnd else x.float()) @ w.T

        m.forward = forward
        m.swiglu = types.MethodType(Linear.swiglu, m)  # not the CPU kernel's own FFN op: every product through forward
    return names


@torch.no_grad()
def logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids]))[0].float()  # (T, V)


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (got - ref).abs()
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none")
    return {"max_abs_diff": round(diff.max().item(), 4), "mean_abs_diff": round(diff.mean().item(), 5),
            "top1_agree": round((got.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4),
            "mean_kl": float(f"{kl.sum(-1).mean().item():.3g}")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--tokens", type=int, default=400)
    args = p.parse_args()
    for path in args.models:
        exact = open_any(path, "cpu", torch.float32, quant="keep")
        ids = exact.tokenizer.encode(TEXT.read_text())[: args.tokens]
        as_twins(exact.model, round_int4=False)
        ref = logits(exact.model, ids)
        del exact
        dp4a = open_any(path, "cpu", torch.float32, quant="keep")
        rounded_layers = as_twins(dp4a.model, round_int4=True)
        got = logits(dp4a.model, ids)
        del dp4a
        bf16 = open_any(path, "cpu", torch.bfloat16, quant="none")
        floor = logits(bf16.model, ids)
        del bf16
        print(json.dumps({"model": path, "positions": len(ids), "logit_range": round(ref.abs().max().item(), 3),
                          "int4_layers_rounded": len(rounded_layers),
                          "dp4a": compare(got, ref), "bf16": compare(floor, ref)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
