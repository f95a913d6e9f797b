"""Where a chat session's load goes (CUDA): open_session as the app opens it (its defaults: "auto",
its sampling settings), under cProfile, until its step is ready. Prints the load's seconds, the
graph captures (each GraphDecoder._record: its key and seconds) and the top functions by
cumulative time. Run it twice with one TRITON_CACHE_DIR, first empty: a cold load, then a warm one.

    python scripts/load_profile.py MODEL [--top 30]
"""

import argparse
import cProfile
import pstats
import sys
import time

from chat_app.__main__ import COMPILE, build_parser, sampling_params
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.session.chat import open_session

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--top", type=int, default=30)
p.add_argument("--device", default="cuda")
a = p.parse_args()
args = build_parser().parse_args(["--model", a.model])
records = []
record = GraphDecoder._record


def timed_record(self, shape, steps):
    t0 = time.perf_counter()
    out = record(self, shape, steps)
    records.append((shape, steps, self.greedy, time.perf_counter() - t0))
    return out


GraphDecoder._record = timed_record
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
session = open_session(a.model, a.device, max_len=args.max_len, params=sampling_params(args), system=args.system,
                       compile=COMPILE[args.compile], quant=args.quant)
session.wait_compiled()
prof.disable()
print(f"open to ready: {time.perf_counter() - t0:.2f} s, step {session.step_kind}", file=sys.stderr)
print(f"{len(records)} graphs captured in {sum(r[-1] for r in records):.2f} s:", file=sys.stderr)
for shape, steps, greedy, s in records:
    print(f"  {shape} x{steps} greedy={greedy}: {s:.3f} s", file=sys.stderr)
pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(a.top)
