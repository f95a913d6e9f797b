"""Host time of reading one chain's report (Engine._read) at many rows, with and without an event per
token: `PYTHONPATH=. .venv/bin/python scripts/engine_read_cost.py [ROWS] [STEPS]` (default 512, 8).
No model runs: a report of random ids for live requests that do not end."""

import sys
import time

import torch

from tests.conftest import tiny_model
from tinyllm.cuda_graph import MAX_RUN, Chunk
from tinyllm.decode.engine import Engine, Request, _Launched
from tinyllm.decode.sampling import SamplingParams

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 512
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
model = tiny_model()
report = torch.randint(0, 500, (rows, MAX_RUN + 2))
report[:, -1] = 0  # running: no request ends
for token_events in (True, False):
    engine = Engine(model, rows, max_len=64, chain=steps, token_events=token_events)
    reqs = [Request(i, [1], SamplingParams(max_tokens=10**6), [], 0, tokens=[5]) for i in range(rows)]
    n, t0 = 50, time.perf_counter()
    for _ in range(n):
        engine._read(_Launched(Chunk(MAX_RUN + 2, report, None), list(enumerate(reqs)), steps), [])
    print(f"token_events={token_events}: {(time.perf_counter() - t0) / n * 1e3:.2f} ms a chain of {steps} "
          f"at {rows} rows")
