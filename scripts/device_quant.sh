#!/usr/bin/env bash
# Quantized weights on the H200 (docs/BENCHMARKS-LOG.md, "Quantized weights on the H200"). Run from
# the repo root; results go to $OUT (default ./out). The defaults fit one 10-minute device call
# (a cold 1.1B compile takes about 70 s of each bench), most important first:
#  1. the TinyLlama-1.1B shape, bf16 vs int8 vs int4 (QUANTS), compiled step in CUDA graphs,
#     each in its own process, back to back (BENCH_S each);
#  2. the quantized CUDA tests (TESTS_S): kernels against the dequantized product; graph
#     replay of the quantized step equals its eager run, plain and compiled;
#  3. scripts/qgemv_sweep.py (SWEEP_S; SWEEP_MODELS / SWEEP_KINDS narrow it: every block
#     choice costs a Triton compile, about 4 s there);
#  4. SmolLM2-135M Q4_1 GGUF (if data/smollm2/ holds it): bf16 load vs kept quantized.
# A step given 0 seconds is skipped.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

for q in ${QUANTS:-int8 int4 none}; do
  [ "${BENCH_S:-115}" = 0 ] && break
  timeout "${BENCH_S:-115}" python3 -m tinyllm.tools.cli bench --preset tinyllama-1.1b --device cuda --quant "$q" --compile on \
      --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > "$OUT/tinyllama_$q.jsonl" 2> "$OUT/tinyllama_$q.err"
  echo "tinyllama $q rc=$?"; grep -h '"decode_tok_s"' "$OUT/tinyllama_$q.jsonl" | cut -c1-40,150-220
done

if [ "${TESTS_S:-90}" != 0 ]; then
  timeout "${TESTS_S:-90}" python3 -m pytest -q -rfs --tb=short tests/tinyllm/test_qgemv.py \
      tests/tinyllm/test_quant_cuda.py > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; tail -6 "$OUT/tests.txt"
fi

if [ "${SWEEP_S:-120}" != 0 ]; then
  SWEEP_MODELS=${SWEEP_MODELS:-1.1b} timeout "${SWEEP_S:-120}" python3 scripts/qgemv_sweep.py \
      > "$OUT/sweep.jsonl" 2> "$OUT/sweep.err"
  echo "sweep rc=$?"; grep -v '^{' "$OUT/sweep.jsonl"; tail -3 "$OUT/sweep.err"
fi

G=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$G" ]; then
  for q in none keep; do
    timeout 60 python3 -m tinyllm.tools.cli bench --model "$G" --device cuda --quant "$q" --compile on --peers off \
        --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > "$OUT/smollm2_$q.jsonl" 2> "$OUT/smollm2_$q.err"
  done
fi

python3 - "$OUT" <<'PY' > "$OUT/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_*.jsonl")):
    for line in f.read_text().splitlines():
        r = json.loads(line)
        if r.get("metric") in ("decode_tok_s", "weights_mib", "compile_capture_s"):
            print(f.stem, r["metric"], r.get("impl", ""), r["value"])
PY
cat "$OUT/summary.txt"
