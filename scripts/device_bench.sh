#!/bin/bash
# Device call B: the 125m and TinyLlama-1.1B shapes with peers, and the engine.
# Usage (on the H200): bash scripts/device_bench.sh   (JSON lines and tables under $OUT)
export PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b() { name=$1; shift; python3 -m tinyllm.tools.cli bench "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.txt"; echo "== $name rc=$?"; grep -v "^{" "$OUT/$name.txt" | grep -v -i "warn" | tail -${TAIL:-40}; }
b bench_1b --preset tinyllama-1.1b --repeats 3 --steps 128 --peers on --prompt-lens 128,512,2048
b engine_125m --preset 125m --engine --repeats 2 --steps 256 --compile off
b engine_125m_compiled --preset 125m --engine --repeats 2 --steps 256 --compile on --concurrency 64
b bench_125m --preset 125m --repeats 3 --steps 128 --peers on
