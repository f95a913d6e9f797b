#!/usr/bin/env bash
# Issue 44 on the H200: decode attention at long windows (4k-128k keys) and the engine's sync
# test, then the long-context targets as benchmarks, in two calls (each phase has its own time
# limit, so a call ends within its 10 minutes); a phase can be run alone.
#
#   run(carry=[".whl"], command="bash scripts/device_long.sh")          tests, then starts (<= 9 min)
#   run(carry=[".whl"], command="LIMIT_SUITE=400 bash scripts/device_long.sh suite starts")
#   run(carry=[".whl"], command="bash scripts/device_long.sh engine")   the engine (<= 9 min)
#
#   suite   python3 -m pytest -m cuda tests, over 6 processes where pytest-xdist is carried: $OUT/cuda-suite.log
#   tests   python3 -m pytest -m cuda: tests/tinyllm/test_decode_attention_long.py (4k-128k keys,
#           D 64/128/256, any tile), tests/tinyllm/test_engine_cuda.py (the no-hidden-sync test),
#           tests/tinyllm/test_decode_attention.py (the 4,096-key tile case): $OUT/cuda-tests.log
#   starts  the 1.1B shape (tinyllama-1.1b, random bf16 weights) at batch 1, graphs, plain and
#           compiled, from 128, 8,192 and 32,768 keys, alternated (target: >= 0.8x at 8k and 32k
#           of its speed at 128): $OUT/bench-starts.jsonl
#   engine  the engine on 125m, 256 rows, compiled graphs, at max_len 1,024 and 8,192, alternated
#           (target: >= 0.7x at 8,192), with syncs per step and capture time (only the windows
#           the runs use are captured: bench_long's contract): $OUT/bench-engine.jsonl
# The wheels the image lacks (.whl/, as scripts/device_families.sh says) go to /tmp/site if carried.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-long-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || { echo "wheels failed"; tail -5 "$OUT/pip.log"; }
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>/dev/null || echo "torch or triton missing"
phases=${1:-tests starts}
for phase in $phases; do
  case "$phase" in
    tests)
      timeout "${LIMIT_TESTS:-360}" python3 -m pytest -q -rf -m cuda -p no:cacheprovider --durations=15 \
        tests/tinyllm/test_decode_attention_long.py tests/tinyllm/test_engine_cuda.py \
        tests/tinyllm/test_decode_attention.py > "$OUT/cuda-tests.log" 2>&1
      echo "== tests: pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$OUT/cuda-tests.log" | tail -25
      ;;
    suite)
      # The whole CUDA suite (the long windows included), over WORKERS processes on the one GPU
      # where pytest-xdist was carried (.whl/): most of a CUDA test's time is Inductor on the CPU.
      n=""; python3 -c "import xdist" 2> /dev/null && n="-n ${WORKERS:-6}"
      timeout "${LIMIT_SUITE:-540}" python3 -m pytest -q -rf -m cuda -p no:cacheprovider $n --durations=25 \
        tests > "$OUT/cuda-suite.log" 2>&1
      echo "== suite: pytest exit $? ($n)"; grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$OUT/cuda-suite.log" | tail -40
      ;;
    starts)
      timeout "${LIMIT_STARTS:-170}" python3 -m tinyllm.tools.cli bench-long --preset tinyllama-1.1b \
        --starts 128,8192,32768 --steps 256 --rounds 5 --compile on > "$OUT/bench-starts.jsonl" 2> "$OUT/bench-starts.err"
      echo "== starts: exit $?"; grep -v -i warn "$OUT/bench-starts.err" | tail -14
      ;;
    engine)
      timeout "${LIMIT_ENGINE:-520}" python3 -m tinyllm.tools.cli bench-long --preset 125m --engine-rows 256 \
        --max-lens 1024,8192 --steps 256 --rounds 3 --compile on > "$OUT/bench-engine.jsonl" 2> "$OUT/bench-engine.err"
      echo "== engine: exit $?"; grep -v -i warn "$OUT/bench-engine.err" | tail -10
      ;;
    *) echo "unknown phase $phase (suite, tests, starts, engine)"; exit 2 ;;
  esac
done
