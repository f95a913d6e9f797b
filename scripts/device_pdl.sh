#!/usr/bin/env bash
# PDL on the H200 (tinyllm.pdl; docs/BENCHMARKS.md, ninth session). Run from the repo root;
# results go to $OUT (default ./out). One 10-minute device call, most important first:
#  1. what this torch / Triton offer (Inductor's enable_pdl, Triton's gdc_wait);
#  2. the CUDA tests of the kernels that launch with PDL (products, decode attention, the
#     quantized step's graph replay against its eager run) and of the graphed decoders;
#  3. `tinyllm-bench --profile` of the TinyLlama-1.1B shape at int8 with TINYLLM_PDL=0,
#     =kernels (ours only) and =1 (ours and Inductor's): one step's replay time, plain and
#     compiled, and its kernels (Chrome traces in $OUT/traces.tgz);
#  4. the same shape's decode speed, int8 and bf16, PDL on (the issue's numbers).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT" /tmp/traces
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 - <<'PY' | tee "$OUT/probe.txt"
import torch, triton, triton.language as tl, torch._inductor.config as c
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)
print("inductor enable_pdl:", hasattr(c.triton, "enable_pdl"), "gdc_wait:", hasattr(tl.extra.cuda, "gdc_wait"))
from tinyllm import pdl
print("pdl.enabled:", pdl.enabled(torch.device("cuda")), "inductor:", pdl.inductor_enabled())
PY

if [ "${TESTS_S:-120}" != 0 ]; then
  timeout "${TESTS_S:-120}" python3 -m pytest -q -x -rfs --tb=short -m cuda tests/tinyllm/test_qgemv.py \
      tests/tinyllm/test_quant_cuda.py tests/tinyllm/test_decode_attention.py tests/tinyllm/test_cuda_graph_cuda.py \
      > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; tail -4 "$OUT/tests.txt"
fi

prof() {  # $1: TINYLLM_PDL
  TINYLLM_PDL=$1 TINYLLM_TRACE_DIR=/tmp/traces/$1 timeout "${PROF_S:-130}" python3 -m tinyllm.bench \
      --preset tinyllama-1.1b --device cuda --quant int8 --profile > "$OUT/profile_$1.jsonl" 2> "$OUT/profile_$1.err"
  echo "profile PDL=$1 rc=$?"; grep -h replay_us "$OUT/profile_$1.jsonl" | cut -c1-200
}
for v in ${PDLS:-0 kernels 1}; do mkdir -p /tmp/traces/$v; prof $v; done
tar czf "$OUT/traces.tgz" -C /tmp traces

for q in ${QUANTS:-int8 none}; do
  [ "${BENCH_S:-120}" = 0 ] && break
  timeout "${BENCH_S:-120}" python3 -m tinyllm.bench --preset tinyllama-1.1b --device cuda --quant "$q" --compile on \
      --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > "$OUT/tinyllama_$q.jsonl" 2> "$OUT/tinyllama_$q.err"
  echo "tinyllama $q rc=$?"
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("metric") in ("decode_tok_s", "replay_us", "kernels_per_step", "weights_mib"):
            print(f.stem, r["metric"], r.get("impl", ""), r.get("window", ""), round(r["value"], 1))
PY
