"""Quick batch-1 decode probe: tok/s with graphs vs the same static step eager, per preset.
Usage: python scripts/quick_speed.py [preset ...]   (the full benchmark is tinyllm-bench)"""

import sys
import time

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.model import ModelConfig, Transformer


def tok_per_s(dec: GraphDecoder, steps: int) -> float:
    dec.prefill(torch.randint(0, 100, (1, 64), device=dec.model.device))
    tok = torch.zeros(1, 1, dtype=torch.long, device=dec.model.device)
    for _ in range(8):
        dec.step(tok)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = dec.step(tok)[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


for name in sys.argv[1:] or ["tinychat", "125m", "tinyllama-1.1b"]:
    cfg = ModelConfig.from_name(name)
    model = Transformer(cfg).init_weights(0).to("cuda", torch.bfloat16).eval()
    dec = GraphDecoder(model, 1, max_len=min(1024, cfg.max_seq_len))
    dec.prefill(torch.zeros(1, 8, dtype=torch.long, device="cuda"))
    cap = dec.capture()
    g = tok_per_s(dec, 300)
    dec.use_graph = False
    e = tok_per_s(dec, 100)
    print(f"{name:16s} params {model.num_params() / 1e6:7.1f}M  graphs {g:8.0f} tok/s  eager {e:6.0f} tok/s"
          f"  ratio {g / e:5.1f}x  capture {cap * 1000:.0f} ms", flush=True)
