#!/usr/bin/env bash
# Issue 50's device lease in three calls, each within 10 minutes (docs/BENCHMARKS.md, "llama.cpp's CUDA
# build beside tinyllm"). Carry ["data/device", ".whl"]; move models/tinychat/*.safetensors out of the
# tree first (76 MB: a call carries 64 MiB), since `shape` rebuilds the default model's shape there.
#   run(command="bash scripts/device_issue50.sh one", carry=[...])    setup, llama.cpp's CUDA build (in
#       the background), the files unpacked, the default model's shape, the CUDA tests not yet run on
#       a GPU (the words and dp4a products, and what the last lease failed or did not reach), then
#       llama-bench once the build is done
#   run(command="bash scripts/device_issue50.sh two", ...)    tinyllm's plain step on each file: the
#       bytes int4 kernel, the words kernel (TINYLLM_INT4_KERNEL=words) and dp4a (TINYLLM_INT4_DP4A=1)
#   run(command="bash scripts/device_issue50.sh three", ...)  the app on the default model's shape
#       (a cold launch, then a warm one), a profile of Qwen's plain step, the table
#   run(command="bash scripts/device_issue50.sh vram", ...)   the 8B at one context (4,096) on both sides:
#       VRAM against llama.cpp's (the target: at most 1.15x), the words kernel (after `one`)
# With less device time (about 15 minutes), two calls without llama.cpp (its numbers from the lease before):
#   lean1: setup, the 8B and SmolLM2 files, the default model's shape, the app on it (a cold launch),
#          then the 8B's plain step with the bytes, words and dp4a int4 products; lean2: the new CUDA
#          tests, the app again (a warm launch), SmolLM2's plain step with the bytes and words kernels.
# Everything lands in $OUT (the files that come back).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { echo $((${1:-560} - (SECONDS - T0))); }
TESTS=(tests/tinyllm/test_qgemv_words.py tests/tinyllm/test_qgemv_dp4a.py tests/tinyllm/test_fused_step.py
       tests/tinyllm/test_decode_attention.py tests/tinyllm/test_decode_attention_long.py)
case ${1:-} in
one)
  bash scripts/device_fused.sh setup || exit 1
  JOBS=12 bash scripts/gpu_side_by_side.sh build unpack 2>&1 | tail -3
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -2
  bash scripts/device_fused.sh tests 200 "${TESTS[@]}" \
      -k "words or dp4a or granite or matches_window_attention or (long_decode and 256)"
  mv "$OUT/cuda_tests.txt" "$OUT/cuda_tests_new.txt"
  TINYLLM_INT4_KERNEL=words bash scripts/device_fused.sh tests 100 tests/tinyllm/test_fused_step.py -k int4
  mv "$OUT/cuda_tests.txt" "$OUT/cuda_tests_words_step.txt"
  BUDGET_S=$(left 570) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -8
  ;;
two)
  COMPILES=off BUDGET_S=$(left 250) MODELS="smollm2 qwen llama3.1" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -4
  COMPILES=off TINYLLM_INT4_KERNEL=words BUDGET_S=$(left 420) MODELS="smollm2 llama3.1" \
      bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -4
  COMPILES=off TINYLLM_INT4_DP4A=1 BUDGET_S=$(left 570) MODELS="llama3.1" bash scripts/gpu_side_by_side.sh tinyllm \
      2>&1 | tail -4
  ;;
three)
  OUT=$OUT bash scripts/device_fused.sh app 170 new on /tmp/tc
  mv "$OUT/app_new_on.err" "$OUT/app_cold.err"
  OUT=$OUT bash scripts/device_fused.sh app 150 new on /tmp/tc
  mv "$OUT/app_new_on.err" "$OUT/app_warm.err"
  PYTHONPATH=/tmp/site:. timeout 120 python3 -m tinyllm.tools.cli bench --device cuda --profile \
      --model /tmp/side_by_side/models/qwen2.5-coder-0.5b.q4_k_m.gguf > "$OUT/profile_qwen.jsonl" 2> "$OUT/profile_qwen.err"
  tail -30 "$OUT/profile_qwen.err"
  bash scripts/gpu_side_by_side.sh table 2>&1 | tail -30
  ;;
vram)
  CONTEXT=4096 MODELS=llama3.1 bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -2
  COMPILES=off TINYLLM_INT4_KERNEL=words BUDGET_S=$(left 560) MODELS=llama3.1 \
      bash scripts/gpu_side_by_side.sh llama tinyllm table 2>&1 | tail -12
  ;;
lean1)
  bash scripts/device_fused.sh setup || exit 1
  FILES="data/device/llama3.1-8b-shape.q4_k_m.tgguf data/device/smollm2-135m.q4_1.tgguf" \
      bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -2
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -2
  OUT=$OUT bash scripts/device_fused.sh app 150 new on /tmp/tc
  mv "$OUT/app_new_on.err" "$OUT/app_cold.err"
  for sw in "" TINYLLM_INT4_KERNEL=words TINYLLM_INT4_DP4A=1; do
    env $sw COMPILES=off BUDGET_S=$(left 560) MODELS=llama3.1 bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -3
  done
  ;;
lean2)
  bash scripts/device_fused.sh tests 150 "${TESTS[@]}" \
      -k "words or dp4a or granite or matches_window_attention or (long_decode and 256)"
  mv "$OUT/cuda_tests.txt" "$OUT/cuda_tests_new.txt"
  OUT=$OUT bash scripts/device_fused.sh app 120 new on /tmp/tc
  mv "$OUT/app_new_on.err" "$OUT/app_warm.err"
  for sw in "" TINYLLM_INT4_KERNEL=words; do
    env $sw COMPILES=off BUDGET_S=$(left 500) MODELS=smollm2 bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -3
  done
  bash scripts/gpu_side_by_side.sh table 2>&1 | tail -20
  ;;
*) echo "usage: $0 one|two|three|vram|lean1|lean2"; exit 2 ;;
esac
