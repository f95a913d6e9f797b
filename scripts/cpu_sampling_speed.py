"""The CPU's native step (tinyllm.decode.cpu_step) with each kind of draw: greedy, top-p, top-k, and
temperature alone (every id a candidate), 128 steps from position 32, rounds alternated in one
process (docs/BENCHMARKS-LOG.md).

Usage: python scripts/cpu_sampling_speed.py MODEL [ROUNDS]   (2 threads; tok/s per round)
"""

import sys
import time

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.decode.sampling import SamplingParams
from tinyllm.formats.open_model import open_any

SETTINGS = {"greedy": SamplingParams(),
            "t0.8 top_p0.95": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
            "t0.8 top_k40": SamplingParams(temperature=0.8, top_k=40, seed=1),
            "t1.0 alone": SamplingParams(temperature=1.0, seed=1)}


@torch.no_grad()
def main(path: str, rounds: int) -> None:
    torch.set_num_threads(2)
    model = open_any(path, quant="keep")[0]
    dec = GraphDecoder(model, 1, max_len=512, use_graph=False)
    cpu_step.use_native(dec)
    prompt = torch.randint(0, 1000, (1, 32))
    dec.prefill(prompt)
    speeds: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name, params in SETTINGS.items():
            dec.sampler.load(params, recent=prompt)
            dec.truncate(32)
            t0 = time.perf_counter()
            for _ in range(128):
                dec.run(1)
            speeds.setdefault(name, []).append(round(128 / (time.perf_counter() - t0)))
    print(path, speeds)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
