"""Held-out loss of several models side by side (tinyllm.tools.eval.heldout), one JSON line each.

    python scripts/heldout_table.py --heldout data/tinychat-distill MODEL [MODEL ...]
    python scripts/heldout_table.py --sample 120 --heldout data/tinychat-distill MODEL ...   # a CPU-sized look

--sample N scores only the first N held-out conversations (written to a temporary folder, so
every model reads the same ones, whatever its tokenizer packs). Models open as the eval opens
them (open_any; fp32 on a CPU, bf16 on CUDA).
"""

from __future__ import annotations

import argparse
import json
import lzma
import tempfile
import time
from pathlib import Path

import torch

from tinyllm.formats.open_model import open_any
from tinyllm.tools import data
from tinyllm.tools.eval.heldout import heldout_loss


def sample_folder(src: str, n: int, dst: Path) -> str:
    """The first n held-out lines of src, as a data folder of its own (still all held out)."""
    lines = []
    for path in data.data_files(src):
        with lzma.open(path, "rb") as f:
            lines += [ln for ln in f if ln.strip() and data.is_eval(ln, 10)]
        if len(lines) >= n:
            break
    with lzma.open(dst / "sample.jsonl.xz", "wb") as f:
        f.writelines(lines[:n])
    return str(dst)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--heldout", default="data/tinychat-distill")
    ap.add_argument("--sample", type=int, default=0, help="only the first N held-out conversations")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = sample_folder(args.heldout, args.sample, Path(tmp)) if args.sample else args.heldout
        for m in args.models:
            t0 = time.perf_counter()
            model, tok, template, name = open_any(m, args.device, None if args.device == "cuda" else torch.float32)
            held = heldout_loss(model, tok, template, folder)
            print(json.dumps({"event": "heldout", "model": m, "name": name, "vocab": tok.vocab_size, **held,
                              "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
