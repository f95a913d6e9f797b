#!/usr/bin/env bash
# Issue 50's device lease in calls of 10 minutes at most (docs/BENCHMARKS.md, "The words int4 kernel on
# an H100"). Carry ["data/device", ".whl"]; move models/tinychat/*.safetensors out of the tree first (76 MB:
# a call carries 64 MiB), since `shape` rebuilds the default model's shape there.
#   one    setup, llama.cpp's CUDA build (in the background), the files unpacked, the default model's
#          shape, the fused step's CUDA tests with the int8 words kernel, the whole `-m cuda` suite, then
#          llama-bench
#   two    the plain step on Qwen 0.5B and the 8B, int8 products by the bytes kernel, then by the words
#          kernel (TINYLLM_INT8_KERNEL=words); Gemma 3 and SmolLM2 on the default
#   three  the app on the default model's shape, a cold launch then a warm one (the words int4 kernel),
#          the table
#   compiled  the compiled step on SmolLM2 and Qwen (whether Inductor still wins over the plain step)
#   vram   the 8B at one context (4,096) on both sides: VRAM against llama.cpp's (at most 1.15x)
#   suite  the whole `-m cuda` suite over 6 processes (198 s on an H200 at 8e6975f); `one` runs it too
#   pause  the app's first reply beside its compile (a reply pauses the compile: BackgroundCompile), cold
#          then warm, and test_background_compile on the device's Python 3.12
# With about 15 minutes: lean1 (setup, the 8B, int8 bytes then words) and lean2 (the new tests, the app).
# Everything lands in $OUT (the files that come back).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { echo $((${1:-560} - (SECONDS - T0))); }
TESTS=(tests/tinyllm/test_qgemv_words.py tests/tinyllm/test_qgemv_dp4a.py tests/tinyllm/test_fused_step.py
       tests/tinyllm/test_decode_attention.py tests/tinyllm/test_decode_attention_long.py)
suite() {  # suite LIMIT: the whole `-m cuda` suite over 6 processes (pytest-xdist is on the image)
  PYTHONPATH=/tmp/site timeout "$1" python3 -m pytest -v -n 6 -rfs --tb=short --durations=25 -m cuda tests > "$OUT/cuda_suite.txt" 2>&1
  echo "== suite rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_suite.txt" | tail -25
}
case ${1:-} in
one)
  bash scripts/device_fused.sh setup || exit 1
  JOBS=8 bash scripts/gpu_side_by_side.sh build unpack 2>&1 | tail -3
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -2
  TINYLLM_INT8_KERNEL=words bash scripts/device_fused.sh tests 100 tests/tinyllm/test_fused_step.py \
      tests/tinyllm/test_qgemv_words.py -k "int8"
  mv "$OUT/cuda_tests.txt" "$OUT/cuda_tests_int8_words.txt"
  suite $(($(left 575) - 90))
  BUDGET_S=$(left 575) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -8
  ;;
two)
  COMPILES=off BUDGET_S=$(left 170) MODELS="qwen" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -4
  COMPILES=off TINYLLM_INT8_KERNEL=words BUDGET_S=$(left 250) MODELS="qwen" bash scripts/gpu_side_by_side.sh tinyllm \
      2>&1 | tail -4
  COMPILES=off TINYLLM_INT8_KERNEL=words BUDGET_S=$(left 410) MODELS="llama3.1" \
      bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -4
  COMPILES=off BUDGET_S=$(left 570) MODELS="gemma3 smollm2" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -4
  ;;
compiled)
  COMPILES=on BUDGET_S=$(left 570) MODELS="smollm2 qwen" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -6
  ;;
suite)
  suite $(left 570)
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
  COMPILES=off BUDGET_S=$(left 560) MODELS=llama3.1 \
      bash scripts/gpu_side_by_side.sh llama tinyllm table 2>&1 | tail -12
  ;;
pause)
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -1
  PYTHONPATH=/tmp/site timeout 60 python3 -m pytest -q -rs tests/tinyllm/test_background_compile.py 2>&1 | tail -3
  for launch in cold warm; do
    OUT=$OUT bash scripts/device_fused.sh app 150 new on /tmp/tc | grep -E "rc=|decode_tok_s |compiled_s|loaded_s|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_$launch.err"
  done
  ;;
lean1)
  bash scripts/device_fused.sh setup || exit 1
  FILES="data/device/llama3.1-8b-shape.q4_k_m.tgguf data/device/qwen2.5-coder-0.5b.q4_k_m.tgguf" \
      bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -2
  for sw in "" TINYLLM_INT8_KERNEL=words; do
    env $sw COMPILES=off BUDGET_S=$(left 560) MODELS="qwen llama3.1" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -3
  done
  ;;
lean2)
  bash scripts/device_fused.sh tests 150 "${TESTS[@]}" -k "int8_words or words_kernel_equals"
  mv "$OUT/cuda_tests.txt" "$OUT/cuda_tests_new.txt"
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -2
  OUT=$OUT bash scripts/device_fused.sh app 240 new on /tmp/tc
  mv "$OUT/app_new_on.err" "$OUT/app_cold.err"
  ;;
*) echo "usage: $0 one|two|three|compiled|vram|suite|pause|lean1|lean2"; exit 2 ;;
esac
