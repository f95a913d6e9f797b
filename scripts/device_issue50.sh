#!/usr/bin/env bash
# Issue 50's device lease in calls of 10 minutes at most (docs/BENCHMARKS.md, "The plain step past 1.9x
# llama.cpp on an H100"). Carry ["data/device", ".whl"] (.whl: textual and what it needs, platformdirs, pyte,
# gguf, httpx-sse: device/README.md; data/device: the speed-equivalent GGUFs, llama.cpp's sources, and its
# CUDA build packed by `diag`, llama-cuda-bin.tar.xz.*, 42 MB, so no lease builds it again); move
# models/tinychat/*.safetensors out of the tree first (76 MB: a call carries 64 MiB) and never `git commit -a`
# while they are out.
# Next: lease8 (one call, about 5 minutes; lease8min if less than 4 minutes of device time are left): the
# precompile (TINYLLM_PRECOMPILE=1, off until it has run on a GPU) and where a launch's load goes.
# The seventh lease (2026-12-07): lease6, lease6b, lease7 (the suite; the side-by-side table in one call), lease7b.
# The fifth lease (2026-12-07, after eight starts that failed, 1,019 s left): lease5, then lease5b (below).
# What the fourth lease (2026-12-07) left, in order (each a call; about 7 minutes each):
#   next   the new kernels' CUDA tests (the fused filters, argmax, push, embedding rows), then the app on the
#          default model's shape: "auto" as Inductor (cold launch), then as the plain step alone
#          (TINYLLM_CUDA_AUTO=plain), with the fused filters and without; the 1B bf16 step's profile
#   bf16   (right after next) the whole -m cuda suite, the 8B beside llama.cpp (VRAM)
#   next2  the whole -m cuda suite; the 8B beside llama.cpp (1.18x in the third lease) at a context of 4,096;
#          SmolLM2 with TINYLLM_ATTN_TILE=0 (short windows split too); Qwen on the host's cores (4, 8, 15 threads)
# Earlier phases, kept: diag, cpudiag, final, final2, one, two, three, four, app, cpu (below).
# Everything lands in $OUT (the files that come back: at most 8).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { echo $((${1:-560} - (SECONDS - T0))); }
suite() {  # suite LIMIT: the whole `-m cuda` suite over 8 processes (pytest-xdist is on the image)
  PYTHONPATH=/tmp/site timeout "$1" python3 -m pytest -v -n 8 -rfs --tb=short --durations=25 -m cuda tests \
      > "$OUT/cuda_suite.txt" 2>&1
  echo "== suite rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_suite.txt" | tail -25
}
shape() {  # the default model's shape, random weights in its shipped forms: /tmp/tc
  bash scripts/device_fused.sh shape models/tinychat /tmp/tc --quant int4 --half-scales --form tok_emb=int4 \
      --form blocks.0.=int8 --form blocks.26.=int8 --form blocks.27.=int8 --form blocks.28.=int8 \
      --form blocks.29.=int8 --name tinychat 2>&1 | tail -1
}
profile() {  # profile NAME FILE: tinyllm bench --profile (kernels a step, the largest ones)
  PYTHONPATH=/tmp/site:. timeout "$(left 560)" python3 -m tinyllm.tools.cli bench --device cuda --profile \
      --model "$2" > "$OUT/profile_$1.jsonl" 2> "$OUT/profile_$1.err"
  grep -E "==|kernels_per_step|replay_us" "$OUT/profile_$1.err" | head -12
}
pack() {  # llama.cpp's CUDA build, packed into $OUT once: carried back in data/device, it spares a later lease the build
  [ -x /tmp/side_by_side/build-cuda/bin/llama-bench ] && [ ! -f /tmp/packed ] || return 0
  tar -C /tmp/side_by_side/build-cuda -cf - bin | xz -6 -T16 | split -b 15M - "$OUT/llama-cuda-bin.tar.xz."
  touch /tmp/packed; ls -la "$OUT" | grep llama-cuda
}
restore() {  # llama.cpp's CUDA build as diag packed it (data/device/llama-cuda-bin.tar.xz.*), where it was carried
  [ -x /tmp/side_by_side/build-cuda/bin/llama-bench ] && return 0
  compgen -G "data/device/llama-cuda-bin.tar.xz.*" > /dev/null || return 0
  mkdir -p /tmp/side_by_side/build-cuda && cat data/device/llama-cuda-bin.tar.xz.* | xz -d | tar -x -C /tmp/side_by_side/build-cuda
  /tmp/side_by_side/build-cuda/bin/llama-bench --help > /dev/null 2>&1 && echo "llama.cpp CUDA build: restored" \
      || echo "llama.cpp CUDA build: restored, but it does not run"
}
case ${1:-} in
diag)  # 2026-12-08's first call: where the plain step's time goes (per-kernel, PDL off and on), while
       # llama.cpp's CUDA build runs in the background; its binaries come back packed for later calls
  bash scripts/device_fused.sh setup || exit 1
  JOBS=14 bash scripts/gpu_side_by_side.sh build 2>&1 | tail -1
  FILES="data/device/smollm2-135m.q4_1.tgguf data/device/gemma3-270m.q4_k_m.tgguf data/device/qwen2.5-coder-0.5b.q4_k_m.tgguf" \
      bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  M=/tmp/side_by_side/models
  D=/tmp/diag; mkdir -p $D /tmp/traces  # everything small lands in $D, packed into one file at the end (8 files come back)
  PYTHONPATH=/tmp/site timeout 170 python3 -m pytest -q -n 4 -p no:randomly -m cuda tests/tinyllm/test_qgemv_post.py \
      tests/tinyllm/test_fused_step.py > $D/cuda_tests.txt 2>&1; echo "== tests rc=$?"; grep -E "passed|failed|^FAILED" $D/cuda_tests.txt | tail -8
  for fp in smollm2-135m.q4_1:0 smollm2-135m.q4_1:1 gemma3-270m.q4_k_m:0 gemma3-270m.q4_k_m:1 qwen2.5-coder-0.5b.q4_k_m:0; do
    f=${fp%:*} pdl=${fp#*:}
    echo "== $f PDL=$pdl (+$((SECONDS - T0)) s)"
    mkdir -p /tmp/traces/${f}_pdl$pdl
    TINYLLM_PDL=$pdl TINYLLM_TRACE_DIR=/tmp/traces/${f}_pdl$pdl PYTHONPATH=/tmp/site:. timeout 100 python3 -m tinyllm.tools.cli \
        bench --device cuda --profile --compile off --model $M/$f.gguf > "$D/profile_${f}_pdl$pdl.jsonl" 2> /tmp/p.err
    grep -vi warn /tmp/p.err | grep -v "_warn_once" | tee -a "$D/profiles.txt" | grep -E "==|replay_us"
  done
  for fold in 0 1; do  # Gemma's post-norms as kernels of their own (0), or inside the O and down products (1)
    TINYLLM_POST_FOLD=$fold PYTHONPATH=/tmp/site:. timeout 120 python3 -m tinyllm.tools.cli bench --device cuda \
        --model $M/gemma3-270m.q4_k_m.gguf --compile off --peers off --steps 256 --repeats 3 --prompt-lens 16 \
        --no-buckets > "$D/gemma_fold$fold.jsonl" 2> $D/gemma_fold$fold.err
    echo "gemma TINYLLM_POST_FOLD=$fold: $(grep -E 'decode_tok_s +impl=graph ' $D/gemma_fold$fold.err)"
  done
  PYTHONPATH=/tmp/site:. timeout 120 python3 -m tinyllm.tools.cli bench --device cuda --preset llama3.2-1b \
      --compile off --peers off --steps 256 --repeats 3 --prompt-lens 16 --no-buckets > "$D/llama3.2-1b_off.jsonl" 2> $D/llama3.2-1b_off.err
  grep -E "decode_tok_s|bandwidth" $D/llama3.2-1b_off.err
  BUDGET_S=$(left 520) bash scripts/gpu_side_by_side.sh wait 2>&1 | tail -2
  pack
  tar -C /tmp -cJf "$OUT/diag.tar.xz" diag traces; ls -la "$OUT"
  ;;
cpudiag)  # right after diag, on the same machine: llama.cpp CUDA on the files diag measured, then the host's 16 cores: llama.cpp's CPU build, both sides at 1-15 threads, and the pool's
          # threshold (TINYLLM_CPU_MIN_BLOCKS) at 4096 (the default then) and 512: scripts/cpu_threads.py
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  M=/tmp/side_by_side/models
  BUDGET_S=200 bash scripts/gpu_side_by_side.sh wait 2>&1 | tail -1  # the CUDA build, if it still runs
  pack
  MODELS="smollm2 gemma3 qwen" BUDGET_S=$(left 280) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  grep -h '"llama.cpp' /tmp/side_by_side/results.jsonl | cut -c1-220
  JOBS=16 bash scripts/gpu_side_by_side.sh cpu-build 2>&1 | tail -1
  BUDGET_S=$(left 430) bash scripts/gpu_side_by_side.sh wait 2>&1 | tail -1
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" | cut -c1-200
  f=smollm2-135m.q4_1
  timeout 100 /tmp/side_by_side/build-cpu/bin/llama-bench -m $M/$f.gguf -t 1,4,8,15 -p 0 -n 64 -r 2 > "$OUT/llama_cpu_$f.md" 2>&1
  grep -E "tg64" "$OUT/llama_cpu_$f.md"
  for mb in 4096 512; do
    TINYLLM_CPU_MIN_BLOCKS=$mb PYTHONPATH=/tmp/site:. timeout $(left 545) python3 scripts/cpu_threads.py $M/$f.gguf \
        --threads 1,4,8,15 --steps 64 --repeats 2 >> "$OUT/tinyllm_cpu_threads.jsonl" 2> /tmp/ct.err
    grep -E "threads" /tmp/ct.err || tail -3 /tmp/ct.err
  done
  ;;
lease7)  # the seventh lease, one call: the whole -m cuda suite; the side-by-side table of every file in one run
        # (llama.cpp then tinyllm's plain step, a context of 512, the bench's bandwidth probe no longer in its
        # VRAM); the Llama-3.2-1B bf16 step's profile with the narrow dense rule, then with the old rule for all
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  restore
  suite 240
  CONTEXT=512 bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  TINYLLM_ARGS=--no-eager COMPILES=off BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh tinyllm table 2>&1 | tail -7
  for r in narrow:"" old:16,512,4; do
    [ "$(left 560)" -gt 50 ] || break
    TINYLLM_QGEMV_BLOCKS=${r#*:} PYTHONPATH=/tmp/site:. timeout "$(left 560)" python3 -m tinyllm.tools.cli bench \
        --device cuda --preset llama3.2-1b --profile --compile off --peers off > "$OUT/profile_1b_${r%%:*}.jsonl" \
        2> "$OUT/profile_1b_${r%%:*}.err"
    echo "== 1B, ${r%%:*} rule"; grep -E "replay_us|kernels_per_step" "$OUT/profile_1b_${r%%:*}.err" | head -6
  done
  cp /tmp/side_by_side/*.log "$OUT/" 2> /dev/null
  ;;
lease7b)  # after lease7: the app on the default model's shape (chat_app.bench), a cold launch then a warm one,
         # with the defaults (the plain step, its graphs captured ahead; the fused filters): the status bar
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  [ -d /tmp/tc ] || shape
  for launch in cold warm; do
    OUT=$OUT bash scripts/device_fused.sh app 110 new on /tmp/tc | grep -E "rc=|decode_tok_s |launch_to|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_$launch.err"; mv "$OUT/app.jsonl" "$OUT/app_$launch.jsonl" 2> /dev/null
  done
  ;;
lease8min)  # lease8 in about 150 s: the precompile's CUDA test and the graph tests, then a cold load with it and
            # one without it (scripts/load_profile.py on the default model's shape)
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  [ -d /tmp/tc ] || shape
  PYTHONPATH=/tmp/site timeout 70 python3 -m pytest -q -n 8 -p no:randomly -m cuda tests/tinyllm/test_precompile.py \
      tests/tinyllm/test_cuda_graph_cuda.py > "$OUT/cuda_tests_lease8.txt" 2>&1
  echo "== tests rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/cuda_tests_lease8.txt" | tail -8
  for pre in 1 0; do
    rm -rf /tmp/triton_$pre
    TRITON_CACHE_DIR=/tmp/triton_$pre TINYLLM_PRECOMPILE=$pre PYTHONPATH=/tmp/site:. timeout 50 python3 \
        scripts/load_profile.py /tmp/tc --top 40 2> "$OUT/load_cold_precompile$pre.txt"
    echo "== precompile $pre, cold: rc=$?"; grep -E "^open to ready|graphs captured" "$OUT/load_cold_precompile$pre.txt"
  done
  python3 scripts/triton_cache_count.py /tmp/triton_1
  ;;
lease8)  # one call: the precompile (tinyllm.kernels.precompile) on the GPU: its CUDA test and the graph tests, then
         # where a launch's load goes (scripts/load_profile.py, the default model's shape as the app opens it):
         # cold with the precompile, warm, cold without it (TINYLLM_PRECOMPILE=0); then the app itself, cold
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  [ -d /tmp/tc ] || shape
  PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -n 8 -p no:randomly -m cuda tests/tinyllm/test_precompile.py \
      tests/tinyllm/test_cuda_graph_cuda.py tests/tinyllm/test_chat_decode.py tests/tinyllm/test_engine_cuda.py \
      > "$OUT/cuda_tests_lease8.txt" 2>&1
  echo "== tests rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/cuda_tests_lease8.txt" | tail -8
  for run in on:cold:a on:warm:a off:cold:b; do
    IFS=: read -r pre launch cache <<< "$run"
    [ "$launch" = cold ] && rm -rf /tmp/triton_$cache
    TRITON_CACHE_DIR=/tmp/triton_$cache TINYLLM_PRECOMPILE=$([ $pre = on ] && echo 1 || echo 0) PYTHONPATH=/tmp/site:. \
        timeout 120 python3 scripts/load_profile.py /tmp/tc --top 40 2> "$OUT/load_${pre}_$launch.txt"
    echo "== precompile $pre, $launch: rc=$?"; grep -E "^open to ready|graphs captured" "$OUT/load_${pre}_$launch.txt"
  done
  python3 scripts/triton_cache_count.py /tmp/triton_a
  if [ "$(left 380)" -gt 100 ]; then
    rm -rf /tmp/triton_c
    TRITON_CACHE_DIR=/tmp/triton_c OUT=$OUT bash scripts/device_fused.sh app 90 new on /tmp/tc \
        | grep -E "rc=|decode_tok_s |launch_to|status bar"
  fi
  ;;
loadprof)  # where a launch's load goes: the default model's shape opened as the app opens it, cold (an empty
          # Triton cache) then warm (scripts/load_profile.py)
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  [ -d /tmp/tc ] || shape
  export TRITON_CACHE_DIR=/tmp/triton_loadprof; rm -rf $TRITON_CACHE_DIR
  for launch in cold warm; do
    PYTHONPATH=/tmp/site:. timeout 150 python3 scripts/load_profile.py /tmp/tc --top 45 2> "$OUT/load_$launch.txt"
    echo "== $launch rc=$?"; grep -v "^\s*$" "$OUT/load_$launch.txt" | grep -iv warn | head -60 | cut -c1-160
    [ $launch = cold ] && python3 scripts/triton_cache_count.py $TRITON_CACHE_DIR
  done
  ;;
lease6)  # the sixth lease, first call: the whole -m cuda suite (the fifth lease's two failures fixed in 70d2306),
        # then llama.cpp's side of the table, every file at a context of 512 (VRAM at nearly one context:
        # llama-bench's is its 256 generated positions; tinyllm's bench needs 16 + 256)
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  restore
  suite 300
  CONTEXT=512 bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  ;;
lease6b)  # right after lease6 (its unpacked files, $ST): tinyllm's plain step on every file, then the one table;
          # again (the script goes on where it stopped) if it says "call again"
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  TINYLLM_ARGS=--no-eager COMPILES=off BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh tinyllm table 2>&1 | tail -12
  ;;
lease5)  # one call, if the fifth lease gets only one: the whole -m cuda suite (this session's new kernels in it), then
        # the app on the default model's shape with "auto" as the plain step alone (TINYLLM_CUDA_AUTO=plain, its
        # graphs captured ahead, nothing to compile) and the fused filters (the app's defaults run the penalty and
        # DRY): a cold launch, then a warm one (its first reply, its status bar)
  bash scripts/device_fused.sh setup || exit 1
  suite 300
  [ -d /tmp/tc ] || shape
  for launch in cold warm; do
    TINYLLM_CUDA_AUTO=plain TINYLLM_FUSED_FILTERS=1 OUT=$OUT bash scripts/device_fused.sh app 110 new on /tmp/tc \
        | grep -E "rc=|decode_tok_s |launch_to|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_plain_$launch.err"
  done
  ;;
lease5b)  # right after lease5: the app with "auto" as Inductor (warm: its compiled replies), the 8B beside llama.cpp
          # at a context of 4,096 (VRAM), then the 1B bf16 step's profile, in what time is left
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  [ -d /tmp/tc ] || shape
  TINYLLM_CUDA_AUTO=inductor TINYLLM_FUSED_FILTERS=1 OUT=$OUT bash scripts/device_fused.sh app 150 new on /tmp/tc \
      | grep -E "rc=|decode_tok_s |launch_to|status bar"
  mv "$OUT/app_new_on.err" "$OUT/app_inductor.err"
  restore
  CONTEXT=4096 FILES=data/device/llama3.1-8b-shape.q4_k_m.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  MODELS=llama3.1 BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  TINYLLM_ARGS=--no-eager COMPILES=off MODELS=llama3.1 BUDGET_S=$(left 500) bash scripts/gpu_side_by_side.sh tinyllm table \
      2>&1 | tail -4
  [ "$(left 560)" -gt 50 ] && PYTHONPATH=/tmp/site:. timeout "$(left 560)" python3 -m tinyllm.tools.cli bench --device cuda \
      --preset llama3.2-1b --profile --compile off --peers off > "$OUT/profile_1b.jsonl" 2> "$OUT/profile_1b.err"
  grep -v "^\s*$" "$OUT/profile_1b.err" | tail -24
  ;;
next)
  bash scripts/device_fused.sh setup || exit 1
  # this session's new kernels first (the whole suite is bf16's), then the app on the default model's shape
  PYTHONPATH=/tmp/site timeout 90 python3 -m pytest -q -n 8 -p no:randomly -m cuda tests/tinyllm/test_sampler_filters.py \
      tests/tinyllm/test_argmax_kernel.py tests/tinyllm/test_sampler_push.py tests/tinyllm/test_embed_rows.py \
      > "$OUT/cuda_tests_next.txt" 2>&1
  echo "== tests rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/cuda_tests_next.txt" | tail -12
  [ -d /tmp/tc ] || shape
  # The first launch is cold (Triton's and Inductor's caches empty), the rest warm. inductor: the plain step's
  # graphs until the compiled step takes over (today's "auto"); plain: TINYLLM_CUDA_AUTO=plain, the plain step
  # alone, its graphs captured ahead; fused: TINYLLM_FUSED_FILTERS (the app's defaults run the penalty and DRY).
  for run in inductor:1 plain:1 plain:0; do
    auto=${run%:*} fused=${run#*:}
    TINYLLM_CUDA_AUTO=$auto TINYLLM_FUSED_FILTERS=$fused OUT=$OUT bash scripts/device_fused.sh app 110 new on /tmp/tc \
        | grep -E "rc=|decode_tok_s |compiled_s|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_${auto}_fused$fused.err"
  done
  [ "$(left 560)" -gt 50 ] && PYTHONPATH=/tmp/site:. timeout "$(left 560)" python3 -m tinyllm.tools.cli bench --device cuda \
      --preset llama3.2-1b --profile --compile off --peers off > "$OUT/profile_1b.jsonl" 2> "$OUT/profile_1b.err"
  grep -v "^\s*$" "$OUT/profile_1b.err" | tail -24
  ;;
next2)
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  restore
  JOBS=16 bash scripts/gpu_side_by_side.sh cpu-build 2>&1 | tail -1  # 36 s, beside the suite (which is not timed)
  FILES=data/device/qwen2.5-coder-0.5b.q4_k_m.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  suite 300
  CONTEXT=4096 FILES=data/device/llama3.1-8b-shape.q4_k_m.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  MODELS=llama3.1 BUDGET_S=$(left 480) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  TINYLLM_ARGS=--no-eager COMPILES=off MODELS=llama3.1 BUDGET_S=$(left 480) bash scripts/gpu_side_by_side.sh tinyllm table \
      2>&1 | tail -4
  # SmolLM2's attention at W 128 is one program a KV head (3 programs, 4.6 us, more than a product): split always?
  FILES=data/device/smollm2-135m.q4_1.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  for tile in 128 0; do
    [ "$(left 560)" -gt 120 ] && TINYLLM_ATTN_TILE=$tile TINYLLM_ARGS=--no-eager COMPILES=off MODELS=smollm2 \
        BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -1
  done
  f=/tmp/side_by_side/models/qwen2.5-coder-0.5b.q4_k_m.gguf
  if [ "$(left 560)" -gt 80 ] && [ -x /tmp/side_by_side/build-cpu/bin/llama-bench ]; then
    timeout 40 /tmp/side_by_side/build-cpu/bin/llama-bench -m $f -t 4,8,15 -p 0 -n 64 -r 2 2>&1 | grep tg64
    PYTHONPATH=/tmp/site:. timeout $(left 560) python3 scripts/cpu_threads.py $f --threads 4,8,15 --steps 64 --repeats 2 \
        2>&1 | grep threads
  fi
  ;;
bf16)  # right after next, on the same warm machine: the whole -m cuda suite, then the 8B beside llama.cpp at a
      # context of 4,096 (VRAM)
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  restore
  suite 300
  CONTEXT=4096 FILES=data/device/llama3.1-8b-shape.q4_k_m.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  MODELS=llama3.1 BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  TINYLLM_ARGS=--no-eager COMPILES=off MODELS=llama3.1 BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh tinyllm table \
      2>&1 | tail -4
  # in what time is left: SmolLM2's attention at W 128 is one program a KV head (3 programs, 4.6 us): split always?
  if [ "$(left 560)" -gt 100 ]; then
    FILES=data/device/smollm2-135m.q4_1.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
    for tile in 128 0; do
      [ "$(left 560)" -gt 40 ] && TINYLLM_ATTN_TILE=$tile TINYLLM_ARGS=--no-eager COMPILES=off MODELS=smollm2 \
          BUDGET_S=$(left 560) bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -1
    done
  fi
  ;;
sweep1b)  # every block rule of the dense product on the 1B's five matrices, beside cuBLAS's product
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  SWEEP_MODELS=1b PYTHONPATH=/tmp/site:. timeout "$(left 560)" python3 scripts/qgemv_sweep.py > "$OUT/sweep_1b.jsonl" 2>&1
  grep -E "cublas|BEST" "$OUT/sweep_1b.jsonl"; grep step_matrix_us "$OUT/sweep_1b.jsonl" | head -5
  ;;
final)  # 2026-12-07's last lease, first call: the whole -m cuda suite, then llama.cpp CUDA (the build diag packed,
        # carried in data/device) beside the plain step on the three small files
  bash scripts/device_fused.sh setup || exit 1
  restore
  FILES="data/device/smollm2-135m.q4_1.tgguf data/device/gemma3-270m.q4_k_m.tgguf data/device/qwen2.5-coder-0.5b.q4_k_m.tgguf" \
      bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
  suite $(($(left 400) - 160))
  MODELS="smollm2 gemma3 qwen" BUDGET_S=$(left 400) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
  TINYLLM_ARGS=--no-eager COMPILES=off MODELS="smollm2 gemma3 qwen" BUDGET_S=$(left 400) \
      bash scripts/gpu_side_by_side.sh tinyllm table 2>&1 | tail -8
  if [ "$(left 400)" -gt 170 ]; then  # the 8B at a context of 4,096 (tinyllm's bench holds the whole context's K/V)
    CONTEXT=4096 FILES=data/device/llama3.1-8b-shape.q4_k_m.tgguf bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -1
    MODELS=llama3.1 BUDGET_S=$(left 400) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -1
    TINYLLM_ARGS=--no-eager COMPILES=off MODELS=llama3.1 BUDGET_S=$(left 400) bash scripts/gpu_side_by_side.sh tinyllm table \
        2>&1 | tail -9
  fi
  [ "$(left 400)" -gt 70 ] && PYTHONPATH=/tmp/site:. timeout $(($(left 400) - 10)) python3 -m tinyllm.tools.cli bench \
      --device cuda --profile --compile off --model /tmp/side_by_side/models/smollm2-135m.q4_1.gguf 2>&1 \
      | grep -E "kernels per step|replay_us"
  ;;
final2)  # the second call: the app on the default model's shape (cold, warm), then the host's CPU at 4, 8, 15 threads
  [ -d /tmp/site ] || bash scripts/device_fused.sh setup > /dev/null 2>&1
  JOBS=16 bash scripts/gpu_side_by_side.sh cpu-build 2>&1 | tail -1  # 36 s at -j16: done before the app's first reply
  [ -d /tmp/tc ] || shape
  BUDGET_S=120 bash scripts/gpu_side_by_side.sh wait 2>&1 | tail -1
  for launch in cold warm; do
    OUT=$OUT bash scripts/device_fused.sh app 120 new on /tmp/tc | grep -E "rc=|decode_tok_s |compiled_s|loaded_s|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_$launch.err"
  done
  M=/tmp/side_by_side/models
  for f in smollm2-135m.q4_1 qwen2.5-coder-0.5b.q4_k_m; do
    [ "$(left 290)" -gt 60 ] || break
    timeout 60 /tmp/side_by_side/build-cpu/bin/llama-bench -m $M/$f.gguf -t 4,8,15 -p 0 -n 64 -r 2 > "$OUT/llama_cpu_$f.md" 2>&1
    grep -E "tg64" "$OUT/llama_cpu_$f.md"
    PYTHONPATH=/tmp/site:. timeout $(left 290) python3 scripts/cpu_threads.py $M/$f.gguf --threads 4,8,15 --steps 64 \
        --repeats 2 >> "$OUT/tinyllm_cpu_threads.jsonl" 2> /tmp/ct.err
    grep -E "threads" /tmp/ct.err || tail -3 /tmp/ct.err
  done
  ;;
one)
  bash scripts/device_fused.sh setup || exit 1
  JOBS=8 bash scripts/gpu_side_by_side.sh build unpack 2>&1 | tail -3
  shape
  suite $(($(left 575) - 90))
  BUDGET_S=$(left 575) bash scripts/gpu_side_by_side.sh llama 2>&1 | tail -8
  ;;
two)
  COMPILES=off BUDGET_S=$(left 150) MODELS="gemma3" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -3
  profile gemma3 /tmp/side_by_side/models/gemma3-270m.q4_k_m.gguf
  COMPILES=on BUDGET_S=$(left 575) MODELS="smollm2 qwen gemma3" bash scripts/gpu_side_by_side.sh tinyllm 2>&1 | tail -6
  ;;
three)
  CONTEXT=4096 MODELS=llama3.1 bash scripts/gpu_side_by_side.sh unpack 2>&1 | tail -2
  COMPILES=off BUDGET_S=$(left 560) MODELS=llama3.1 \
      bash scripts/gpu_side_by_side.sh llama tinyllm table 2>&1 | tail -14
  ;;
four)
  for c in off on; do
    PYTHONPATH=/tmp/site:. timeout "$(left 280)" python3 -m tinyllm.tools.cli bench --device cuda --preset llama3.2-1b \
        --compile $c --peers off --steps 256 --repeats 3 --prompt-lens 16 --no-buckets > "$OUT/llama3.2-1b_$c.jsonl" \
        2> "$OUT/llama3.2-1b_$c.err"
    grep -E "decode_tok_s|bandwidth" "$OUT/llama3.2-1b_$c.err"
  done
  ;;
app)
  bash scripts/device_fused.sh setup > /dev/null 2>&1 || exit 1
  [ -d /tmp/tc ] || shape
  [ "${SAVED:-}" = 1 ] && export TINYLLM_CUDA_SAVED_STEP=1
  for launch in cold warm; do
    OUT=$OUT bash scripts/device_fused.sh app 170 new on /tmp/tc | grep -E "rc=|decode_tok_s |compiled_s|loaded_s|status bar"
    mv "$OUT/app_new_on.err" "$OUT/app_$launch.err"
  done
  ;;
cpu)
  BUDGET_S=$(left 570) bash scripts/gpu_side_by_side.sh cpu-build wait cpu table 2>&1 | tail -14
  ;;
*) echo "usage: $0 next|next2|diag|cpudiag|final|final2|one|two|three|four|app|cpu"; exit 2 ;;
esac
