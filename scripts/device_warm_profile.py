"""Where a warm compile's time goes (H200 device call): compile the decode step of a preset's
shape in the foreground under cProfile. Run twice in fresh processes with the same cache
folders: the second is the warm start. Usage: python scripts/device_warm_profile.py PRESET TAG"""
import cProfile
import pstats
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

from tinyllm.cuda_graph import GraphDecoder  # noqa: E402
from tinyllm.tools.bench import random_model  # noqa: E402

t_import = time.perf_counter() - t0
model = random_model(sys.argv[1], torch.device("cuda"), torch.bfloat16)
prof = cProfile.Profile()
t1 = time.perf_counter()
prof.enable()
with torch.no_grad():
    dec = GraphDecoder(model, 1, max_len=1024, use_graph=False, compile="inductor")
    dec.prefill(torch.zeros(1, 1, dtype=torch.long, device="cuda"))
    dec.run(1)
    torch.cuda.synchronize()
prof.disable()
print(f"== {sys.argv[2]} {sys.argv[1]}: import {t_import:.1f} s, compile+first step {time.perf_counter() - t1:.1f} s")
st = pstats.Stats(prof)
st.sort_stats("cumulative").print_stats(28)
st.sort_stats("tottime").print_stats(12)
