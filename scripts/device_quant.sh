#!/usr/bin/env bash
# Quantized weights on the H200 (docs/BENCHMARKS.md, "Quantized weights on the H200"). Run from
# the repo root; results go to $OUT (default ./out). About 9 minutes.
#  1. scripts/qgemv_sweep.py: the Triton kernels' block sizes, every choice, and the best rule;
#  2. the quantized tests, CUDA ones included (kernels against the dequantized product; graph
#     replay of the quantized step equals its eager run, plain and compiled);
#  3. the TinyLlama-1.1B shape, bf16 vs int8 vs int4, compiled step in CUDA graphs, each in its
#     own process, back to back; with BLOCKS=best the sweep's best rule, else the module's;
#  4. SmolLM2-135M Q4_1 GGUF (if data/smollm2/ holds it): bf16 load vs kept quantized.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

[ "${SWEEP_S:-170}" = 0 ] || timeout "${SWEEP_S:-170}" python3 scripts/qgemv_sweep.py > "$OUT/sweep.jsonl" 2> "$OUT/sweep.err"
echo "sweep rc=$?"; grep -v '^{' "$OUT/sweep.jsonl"; tail -3 "$OUT/sweep.err"
if [ "${BLOCKS:-}" = best ] && grep -q '^TINYLLM_QGEMV_BLOCKS=' "$OUT/sweep.jsonl"; then
  export "$(grep '^TINYLLM_QGEMV_BLOCKS=' "$OUT/sweep.jsonl")"
  echo "using $TINYLLM_QGEMV_BLOCKS"
fi

[ "${TESTS_S:-110}" = 0 ] || timeout "${TESTS_S:-110}" python3 -m pytest -q -rs tests/tinyllm/test_qgemv.py tests/tinyllm/test_quant_cuda.py \
    tests/tinyllm/test_quant.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -4 "$OUT/tests.txt"

for q in ${QUANTS:-int8 int4 none}; do
  timeout "${BENCH_S:-95}" python3 -m tinyllm.bench --preset tinyllama-1.1b --device cuda --quant "$q" --compile on \
      --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > "$OUT/tinyllama_$q.jsonl" 2> "$OUT/tinyllama_$q.err"
  echo "tinyllama $q rc=$?"; tail -2 "$OUT/tinyllama_$q.err"
done

G=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$G" ]; then
  for q in none keep; do
    timeout 60 python3 -m tinyllm.bench --model "$G" --device cuda --quant "$q" --compile on --peers off \
        --steps 128 --repeats 3 --prompt-lens 128 > "$OUT/smollm2_$q.jsonl" 2> "$OUT/smollm2_$q.err"
  done
fi

python3 - "$OUT" <<'PY' > "$OUT/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_*.jsonl")):
    for line in f.read_text().splitlines():
        r = json.loads(line)
        if r.get("metric") in ("decode_tok_s", "weights_mib", "compile_s"):
            print(f.stem, r["metric"], r.get("impl", ""), r.get("bucket", ""), r["value"])
PY
cat "$OUT/summary.txt"
