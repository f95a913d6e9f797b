#!/bin/bash
# Device call C: the compiled step with matrix-vector products as Inductor reductions
# (model.linear): the compiled CUDA tests, then the default model's and the 1.1B shape's bench.
export PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 170 python3 -m pytest -q -m cuda -k "compile or greedy" tests/tinyllm > "$OUT/cuda_tests.log" 2>&1; echo "tests rc=$?"
tail -4 "$OUT/cuda_tests.log"
b() { name=$1; t=$2; shift 2; timeout "$t" python3 -m tinyllm.tools.cli bench "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.txt"; echo "== $name rc=$?"; grep -E "compile|decode|bucket" "$OUT/$name.txt" | grep -v -i warn; }
b bench_tinychat 100 --model models/tinychat --repeats 3 --peers off --prompt-lens 128
b bench_1b 170 --preset tinyllama-1.1b --repeats 3 --steps 128 --peers off --prompt-lens 512
