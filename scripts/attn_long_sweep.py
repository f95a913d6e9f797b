"""The fused decode attention's launch sizes at long windows, swept on a GPU (issue 44).

For the 1.1B shape at batch 1 (4 KV heads of 64 dims, 8 query rows each, 22 layers: one cache
each, so nothing stays in L2), a CUDA graph of the 22 layers' `rope_decode_attention` calls is
replayed at the window's last key, for each variant of BLOCK_N (keys a split program loads at
once), MAX_SPLITS (split programs a head) and Triton's num_warps and num_stages. Prints one JSON
line per (variant, window): microseconds a layer and the K/V bytes read per second.

    python3 scripts/attn_long_sweep.py --windows 128,8192,32768 > sweep.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from tinyllm.kernels import decode_attention as da
from tinyllm.kernels import decode_attention_triton as T
from tinyllm.kernels import pdl
from tinyllm.model import Rope

LAYERS, HKV, R, D = 22, 4, 8, 64


def layer_inputs(W: int, dev: str):
    """One layer's qkv row and caches, the window full up to its last key."""
    qkv = torch.randn(1, (R + 2) * HKV * D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(1, HKV, W, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(1, HKV, W, D, device=dev, dtype=torch.bfloat16)
    return qkv, kc, vc


def time_variant(W: int, layers, rope, reps: int) -> float:
    """Microseconds a layer: the graph of every layer's call, replayed `reps` times."""
    pos, fv = torch.tensor([W - 1], device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda")

    def step():
        for qkv, kc, vc in layers:
            da.rope_decode_attention(qkv, rope.cos, rope.sin, pos, fv, kc, vc, W, D ** -0.5, 0, 0.0)

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step()
        step()  # compiled, warm
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / reps / len(layers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", default="128,8192,32768")
    ap.add_argument("--block-n", default="64,128")
    ap.add_argument("--max-splits", default="128,256,512")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    base_launch = pdl.launch_options
    torch.manual_seed(0)
    for W in ints(args.windows):
        rope = Rope(D, W + 1, 10000.0, "cuda")
        layers = [layer_inputs(W, "cuda") for _ in range(LAYERS)]
        for block_n, splits, warps, stages in itertools.product(ints(args.block_n), ints(args.max_splits),
                                                               ints(args.warps), ints(args.stages)):
            T.BLOCK_N, T.MAX_SPLITS = block_n, splits
            pdl.launch_options = lambda dev, w=warps, st=stages: {**base_launch(dev), "num_warps": w, "num_stages": st}
            try:
                us = time_variant(W, layers, rope, args.reps)
            except Exception as e:  # a variant that cannot launch: say so, go on
                print(json.dumps(dict(W=W, block_n=block_n, max_splits=splits, warps=warps, stages=stages,
                                      error=str(e).splitlines()[0][:200])), flush=True)
                continue
            kv_bytes = 2 * HKV * W * D * 2
            print(json.dumps(dict(W=W, block_n=block_n, max_splits=splits, warps=warps, stages=stages,
                                  us_per_layer=round(us, 2), gb_s=round(kv_bytes / us / 1e3, 1),
                                  plan=T.plan(W, D, R))), flush=True)


if __name__ == "__main__":
    main()
