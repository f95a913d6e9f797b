"""The native CPU step's logits over a bf16 and an int8 K/V cache against an fp32 one, on real
models and real text (docs/BENCHMARKS.md, "Long context on the CPU"): teacher-forced over N
tokens of a text, then greedy from the end of it, with the app's int8 rounding of x and without
it (use_exact_x), beside the noise floor the app already has: the plain step against the native
one, both fp32. Prints one JSON line a model.

    .venv/bin/python scripts/kv_dtype_error.py [--tokens 400] [--greedy 100] MODEL [MODEL ...]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.formats.open_model import open_any
from tinyllm.kernels import cpu_qgemv

TEXT = Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"


@torch.no_grad()
def run(model, ids: list[int], greedy: int, kv_dtype: torch.dtype, native: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Logits (len(ids) - 1, V) of the native step (or the plain one) fed ids[1:] after a prefill
    of ids[0], then the `greedy` ids it draws after the last."""
    dec = GraphDecoder(model, 1, max_len=len(ids) + greedy + 1, use_graph=False)
    dec.cache.kv_dtype = kv_dtype
    if native:
        cpu_step.use_native(dec, kv_dtype)
    dec.prefill(torch.tensor([ids[:1]]))
    logits = []
    for t in ids[:-1]:
        dec.tok.fill_(t)
        logits.append(dec.run(1)[0, -1].clone())
    dec.tok.fill_(ids[-1])
    drawn = []
    for _ in range(greedy):
        dec.run(1)
        drawn.append(int(dec.tok))
    return torch.stack(logits), drawn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--greedy", type=int, default=100)
    args = p.parse_args()
    for path in args.models:
        loaded = open_any(path, "cpu")
        ids = loaded.tokenizer.encode(TEXT.read_text())[: args.tokens]
        rows = {}
        for exact in (False, True):  # x rounded to int8 blocks (as the app runs), or not (use_exact_x)
            before = cpu_qgemv.use_exact_x(exact)
            try:
                ref, ref_ids = run(loaded.model, ids, args.greedy, torch.float32)
                pairs = {"bf16_cache": run(loaded.model, ids, args.greedy, torch.bfloat16),
                         "int8_cache": run(loaded.model, ids, args.greedy, torch.int8)}
                if not exact:  # the noise floor: the plain step against the native one, both fp32
                    pairs["plain_step_fp32"] = run(loaded.model, ids, args.greedy, torch.float32, native=False)
            finally:
                cpu_qgemv.use_exact_x(before)
            for name, (got, got_ids) in pairs.items():
                diff = (got - ref).abs()
                first = next((i for i, (a, b) in enumerate(zip(ref_ids, got_ids, strict=True)) if a != b), None)
                rows[f"{name}{'_exact_x' if exact else ''}"] = {
                    "max_abs_diff": round(diff.max().item(), 5), "mean_abs_diff": round(diff.mean().item(), 6),
                    "teacher_forced_top1_agree": round((got.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4),
                    "greedy_first_difference": first}
        print(json.dumps({"model": path, "positions": len(ids), "greedy_steps": args.greedy,
                          "logit_range": round(ref.abs().max().item(), 3), "against_native_fp32": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
