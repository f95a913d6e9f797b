#!/usr/bin/env bash
# The app's speed and the decoder's CUDA tests on the H200, in one call (docs/BENCHMARKS.md,
# "The app"). Run from the repo root; results go to $OUT. Needs textual and platformdirs as
# wheels in .whl/ (the device image has neither). Usage: bash scripts/device_app.sh [tests|bench|all] [MODEL...]
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
what=${1:-all}; shift || true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TINYLLM_CHAT_DATA_DIR=/tmp/chatdata
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv >> "$OUT/gpu.txt" 2>&1
if [ "$what" != bench ]; then
  timeout 180 python3 -m pytest -q -rfs --tb=short -m cuda tests/tinyllm > "$OUT/cuda_tests.txt" 2>&1
  tail -3 "$OUT/cuda_tests.txt"
fi
if [ "$what" != tests ]; then
  for model in "$@"; do
    tag=$(basename "$model" | tr -c 'A-Za-z0-9_\n-' _)
    for run in ${RUNS:-cold warm}; do  # the second launch finds the compiled step in Inductor's cache
      timeout 170 python3 -m chat_app.bench --model "$model" --device cuda --tokens 1024 --replies 3 \
          > "$OUT/app_${tag}_$run.jsonl" 2> "$OUT/app_${tag}_$run.err"
      grep -A20 "^metric" "$OUT/app_${tag}_$run.err" | sed "s/^/$tag $run: /"
      tail -c 3000 /tmp/chatdata/session.log > "$OUT/session_${tag}_$run.log" 2>/dev/null
    done
  done
fi
# The library's own numbers for the same models, in the same call.
if [ "$what" != tests ]; then
  for model in "$@"; do
    tag=$(basename "$model" | tr -c 'A-Za-z0-9_\n-' _)
    timeout 110 python3 -m tinyllm.bench --model "$model" --device cuda --repeats 3 --peers off --prompt-lens 128 \
        > "$OUT/lib_$tag.jsonl" 2> "$OUT/lib_$tag.err"
    grep -E '"decode_tok_s"' "$OUT/lib_$tag.jsonl" | cut -c1-160
  done
fi
