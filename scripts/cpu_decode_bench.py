"""CPU decode speed of the candidate shapes (random weights), as the chat app decodes on a CPU:
`GraphDecoder(model, 1, use_graph=False)`, fp32 weights (load_checkpoint's CPU default),
prefill a prompt, then one `step` per token (greedy), batch 1.

    .venv/bin/python scripts/cpu_decode_bench.py [--threads 2] [--tokens 128] [--shapes a,b]

Prints one JSON line per shape: params, bf16/fp32 size on disk, prefill ms, decode tok/s
(best and median of the repeats). The product limit is >= 60 tok/s on a 2-core laptop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from device_train import SHAPES  # scripts/ is on sys.path when run as a script

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.model import ModelConfig, Transformer


def disk_bytes(model: Transformer, bytes_per_param: int) -> int:
    n = model.num_params()  # tied embeddings are counted (and stored) once
    return n * bytes_per_param


@torch.no_grad()
def decode_tok_s(model: Transformer, prompt_len: int, n_tokens: int) -> tuple[float, float]:
    """(prefill ms, decode tok/s) for one prompt and n_tokens greedy steps."""
    dec = GraphDecoder(model, 1, use_graph=False)
    idx = torch.randint(4, model.cfg.vocab_size, (1, prompt_len))  # (1, T)
    t = time.perf_counter()
    logits = dec.prefill(idx)  # (1, 1, V)
    prefill_ms = (time.perf_counter() - t) * 1000
    tok = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    t = time.perf_counter()
    for _ in range(n_tokens):
        tok = dec.step(tok)[:, -1].argmax(-1, keepdim=True)
    return prefill_ms, n_tokens / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.shapes.split(","):
        cfg = ModelConfig.from_name("tinychat", **SHAPES[name])
        model = Transformer(cfg).init_weights(0).eval()
        decode_tok_s(model, 8, 8)  # warm up
        runs = [decode_tok_s(model, args.prompt, args.tokens) for _ in range(args.repeats)]
        speeds = [r[1] for r in runs]
        print(json.dumps({"shape": name, **SHAPES[name], "params_M": round(model.num_params() / 1e6, 2),
                          "bf16_MB": round(disk_bytes(model, 2) / 1e6, 1),
                          "fp32_MB": round(disk_bytes(model, 4) / 1e6, 1),
                          "prefill_ms": round(min(r[0] for r in runs), 1),
                          "tok_s_best": round(max(speeds), 1),
                          "tok_s_median": round(statistics.median(speeds), 1),
                          "threads": args.threads}), flush=True)


if __name__ == "__main__":
    main()
