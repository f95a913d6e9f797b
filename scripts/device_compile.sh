#!/bin/bash
# Device call A: the CUDA tests, a profile of the step, and the default model's bench.
# Usage (on the H200): bash scripts/device_compile.sh   (logs under $OUT)
export PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpu.txt"
python3 -m pytest -q -m cuda tests/tinyllm > "$OUT/cuda_tests.log" 2>&1; echo "tests rc=$?"
tail -5 "$OUT/cuda_tests.log"
python3 -m tinyllm.tools.cli bench --model models/tinychat --profile > "$OUT/profile.jsonl" 2> "$OUT/profile.log"
grep "==" "$OUT/profile.log"
python3 -m tinyllm.tools.cli bench --model models/tinychat --repeats 3 --peers on > "$OUT/bench_tinychat.jsonl" 2> "$OUT/bench_tinychat.txt"
tail -40 "$OUT/bench_tinychat.txt"
