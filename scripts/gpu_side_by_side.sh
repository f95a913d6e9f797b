#!/usr/bin/env bash
# llama.cpp's CUDA build beside tinyllm on one GPU, same files, one table (issue 50, part 3).
#
# Files travel in data/device/ (git-ignored, so carried by name): llama.cpp's sources pruned to what a
# CUDA build of llama-bench needs (1.5 MB .tar.xz), and speed-equivalent GGUFs (.tgguf, scripts/speed_gguf.py:
# each real file's header and its tensors' first blocks, tiled back to full size on the device), SmolLM2-135M
# Q4_1, Gemma-3-270M Q4_K_M, Qwen2.5-Coder-0.5B Q4_K_M and a synthetic Llama-3.1-8B Q4_K_M: 10,585,224 bytes
# in 5 files, 5.76 GB once unpacked. State between calls lives in $ST (default /tmp/side_by_side) on the warm
# machine; each call writes $OUT/side_by_side.log (this call), side_by_side.jsonl (every row so far), and in
# phase table side_by_side.md and side_by_side_table.jsonl.
#
# Here, once (30 s with the files present; else it fetches them as .ci/run and fetch_real_models.sh do):
#   bash scripts/gpu_side_by_side.sh prepare
# On the device, in order (each call well inside 10 minutes; a phase that runs short says "call again" and
# the same call goes on where it stopped):
#   run(command="bash scripts/gpu_side_by_side.sh build unpack", carry=["data/device"])
#       ~1 min: configures the CUDA build and starts llama-bench's (-j16) in the background; unpacks 5.76 GB
#   run(command="bash scripts/gpu_side_by_side.sh llama", carry=["data/device"])
#       waits for the build (estimated 5-8 min in all), then llama-bench -ngl 99 -p 0 -n 256 -r 3, ~1 min
#   run(command="bash scripts/gpu_side_by_side.sh tinyllm", carry=["data/device"])   (2-4 calls)
#       tinyllm bench --compile off, then on, each file, smallest first: ~2-4 min a small file, ~5-8 the 8B
#   run(command="bash scripts/gpu_side_by_side.sh table", carry=["data/device"])     seconds: the table
# The host's CPU, later (never while the CUDA build runs: it takes the cores), llama-bench -t 4,8,15 against
# tinyllm's native step: "cpu-build" (background, ~2 min), then "cpu" (waits for it), then "table".
# A fresh machine has lost $ST: start again at "build unpack".
#
# Knobs (environment): MODELS="smollm2 qwen" (files whose name holds one of the words; default all),
# COMPILES ("off on": tinyllm's plain step, then its compiled one; "off" the plain step alone),
# LLAMA_ARGS (more llama-bench flags, e.g. "-fa on"), TINYLLM_ARGS (more tinyllm bench flags) and any
# TINYLLM_* switch (each set of them is measured and kept apart), CONTEXT=N (unpack: context_length N in
# every file, to compare VRAM at one context; tinyllm's bench holds the whole context's K/V), CPU_THREADS
# ("4 8 15"), BUDGET_S (seconds a call may take, 540). Wheels the device lacks: carry .whl/ too.
# Phases: prepare, prune (here), build, cpu-build, wait, unpack, llama, tinyllm, cpu, table; and dry: on
# this CPU, every device phase small (the CPU build, --device cpu, the 8B shape at 2 layers, 8 steps).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
[ "${1:-}" = dry ] && ST=${ST:-/tmp/side_by_side-dry}
ST=${ST:-/tmp/side_by_side}
OUT=${OUT:-$ST/out}
DEV=${DEV:-data/device}
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$PY" = python3 ] && PY=.venv/bin/python  # here; the device has no venv
BUDGET_S=${BUDGET_S:-540}
DRY=${DRY:-} LLAMA_ARGS=${LLAMA_ARGS:-} TINYLLM_ARGS=${TINYLLM_ARGS:-}
mkdir -p "$ST" "$OUT"
LOG=$OUT/side_by_side.log
RESULTS=$ST/results.jsonl
say() { echo "[$(date +%T) +$((SECONDS - T0))s] $*" | tee -a "$LOG" >&2; }
left() { echo $((BUDGET_S - (SECONDS - T0))); }
export PYTHONPATH=$ST/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" > /dev/null && [ ! -f "$ST/site/.done" ]; then  # wheels the image lacks, if carried
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ST/site" .whl/*.whl >> "$LOG" 2>&1 \
        && touch "$ST/site/.done"
fi

# ---- here: the files that travel ------------------------------------------------------------------
SDIST_SRC=data/llama.cpp-src/vendor/llama.cpp
# What CMake reads when only llama-bench is built (no tests, examples, server, app): every other tool
# and vendored library that tools/ and vendor/ add unconditionally becomes an empty CMakeLists.txt.
KEEP=(CMakeLists.txt LICENSE cmake include src common tools/CMakeLists.txt tools/llama-bench
      vendor/CMakeLists.txt vendor/cpp-httplib vendor/nlohmann vendor/sheredom
      ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src)
STUBS=(tools/batched-bench tools/gguf-split tools/imatrix tools/completion tools/perplexity tools/quantize
       tools/tokenize tools/tts tools/mtmd tools/cvector-generator tools/export-lora tools/fit-params
       tools/results vendor/hash vendor/miniaudio vendor/stb)
# ggml's other backends (added only when switched on) and CPU code for other architectures (x86 only)
DROP=(ggml/src/ggml-{blas,cann,et,hexagon,hip,metal,musa,opencl,openvino,rpc,sycl,virtgpu,vulkan,webgpu,zdnn,zendnn}
      ggml/src/ggml-cpu/arch/{arm,loongarch,powerpc,riscv,s390,wasm} ggml/src/ggml-cpu/spacemit
      ggml/src/ggml-cpu/kleidiai)

prune() {  # data/llama.cpp-src -> $DEV/llama.cpp-src.tar.xz (llama.cpp/ at its top)
    [ -f "$SDIST_SRC/CMakeLists.txt" ] || { say "no $SDIST_SRC: run .ci/run's sdist step (or prepare)"; return 2; }
    local tmp; tmp=$(mktemp -d)
    mkdir -p "$tmp/llama.cpp"
    (cd "$SDIST_SRC" && cp -a --parents "${KEEP[@]}" "$tmp/llama.cpp/")
    (cd "$tmp/llama.cpp" && rm -rf "${DROP[@]}")
    for d in "${STUBS[@]}"; do
        mkdir -p "$tmp/llama.cpp/$d"
        echo "# pruned by scripts/gpu_side_by_side.sh: not needed to build llama-bench" > "$tmp/llama.cpp/$d/CMakeLists.txt"
    done
    mkdir -p "$DEV"
    tar -C "$tmp" -cf - llama.cpp | xz -9e -T2 > "$DEV/llama.cpp-src.tar.xz"
    rm -rf "$tmp"
    say "pruned sources: $DEV/llama.cpp-src.tar.xz, $(stat -c %s "$DEV/llama.cpp-src.tar.xz") bytes"
}

# name | the real file (here) | the packed file's stem in $DEV
REAL=("smollm2|data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|smollm2-135m.q4_1"
      "gemma3-270m|data/gemma3-270m/gemma-3-270m-q4_k_m.gguf|gemma3-270m.q4_k_m"
      "qwen2.5-coder-0.5b|data/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|qwen2.5-coder-0.5b.q4_k_m")

prepare() {  # fetch (if missing), prune, pack: everything data/device holds
    if [ ! -f "$SDIST_SRC/CMakeLists.txt" ]; then  # as .ci/run does
        local sd; sd=$(mktemp -d)
        "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$sd" || return 2
        echo "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  $sd/llama_cpp_python-0.3.36.tar.gz" \
            | sha256sum -c --quiet || return 2
        mkdir -p data/llama.cpp-src && tar -xzf "$sd"/llama_cpp_python-0.3.36.tar.gz -C data/llama.cpp-src --strip-components=1
        rm -rf "$sd"
    fi
    bash scripts/fetch_real_models.sh || return 2
    prune || return 2
    for row in "${REAL[@]}"; do
        IFS='|' read -r _ real stem <<< "$row"
        "$PY" scripts/speed_gguf.py pack "$real" "$DEV/$stem.tgguf" || return 2
    done
    "$PY" scripts/speed_gguf.py synth-llama8b "$DEV/llama3.1-8b-shape.q4_k_m.tgguf" || return 2
    say "data/device: $(du -cb "$DEV"/* | tail -1 | cut -f1) bytes in $(ls "$DEV" | wc -l) files"
}

# ---- the device: builds --------------------------------------------------------------------------
NOAMX=${NOAMX--mno-amx-tile -mno-amx-int8 -mno-amx-bf16}  # scripts/build_llama_cpp.sh says why
COMMON_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
              -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
              -DLLAMA_USE_PREBUILT_UI=OFF)

build() {  # build KIND (cuda | cpu): configure, then llama-bench in the background (setsid: outlives the call)
    local kind=$1 dir=$ST/build-$1 flags
    if [ -x "$dir/bin/llama-bench" ]; then say "$kind build: present"; return 0; fi
    if building; then say "a $(build_kind) build is running: one at a time (they share the cores)"; return 2; fi
    if [ ! -f "$ST/src/llama.cpp/CMakeLists.txt" ]; then
        [ -f "$DEV/llama.cpp-src.tar.xz" ] || { say "no $DEV/llama.cpp-src.tar.xz: carry data/device"; return 2; }
        mkdir -p "$ST/src" && tar -xJf "$DEV/llama.cpp-src.tar.xz" -C "$ST/src" || return 2
    fi
    if [ "$kind" = cuda ]; then
        local nvcc; nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2> /dev/null)
        flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF ${nvcc:+-DCMAKE_CUDA_COMPILER=$nvcc})
    else
        flags=(-DGGML_CUDA=OFF -DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX")
    fi
    rm -f "$ST/build-$kind.rc"
    echo "$kind" > "$ST/building"
    local jobs=${JOBS:-$(nproc)}
    setsid nohup bash -c 'echo "$3 $$" > "$1/building"
        { time { cmake -S "$1/src/llama.cpp" -B "$2" "${@:5}" && cmake --build "$2" --target llama-bench -j "$4"; }; } 2>&1
        echo $? > "$1/build-$3.rc"; rm -f "$1/building"' _ "$ST" "$dir" "$kind" "$jobs" "${COMMON_FLAGS[@]}" "${flags[@]}" \
        > "$ST/build-$kind.log" 2>&1 < /dev/null &
    say "$kind build started in the background (-j$jobs): $ST/build-$kind.log"
}

building() {  # a build runs: its process (the pid in $ST/building) is alive
    [ -f "$ST/building" ] || return 1
    local pid; pid=$(cut -s -d' ' -f2 "$ST/building")
    if [ -n "$pid" ] && ! kill -0 "$pid" 2> /dev/null; then rm -f "$ST/building"; return 1; fi
}
build_kind() { cut -d' ' -f1 "$ST/building" 2> /dev/null; }

wait_build() {  # wait_build KIND: until its llama-bench exists, or the call's budget runs short
    local kind=$1
    while building && [ "$(build_kind)" = "$kind" ] && [ "$(left)" -gt 90 ]; do sleep 5; done
    if [ -x "$ST/build-$kind/bin/llama-bench" ]; then
        say "$kind build: done ($(grep -E '^real' "$ST/build-$kind.log" | tail -1))"; return 0
    fi
    if building; then say "$kind build still running: call again ($(tail -1 "$ST/build-$kind.log"))"; return 3; fi
    say "$kind build failed (rc $(cat "$ST/build-$kind.rc" 2> /dev/null)): the log's end:"
    tail -30 "$ST/build-$kind.log" | tee -a "$LOG" >&2
    return 2
}

# ---- the device: files ---------------------------------------------------------------------------
files() {  # the unpacked files (of $MODELS), smallest first (the 8B last), one a line
    local f
    for f in $(ls -1Sr "$ST"/models/*.gguf 2> /dev/null); do
        if [ -z "${MODELS:-}" ]; then echo "$f"; continue; fi
        for m in $MODELS; do [[ $(basename "$f") == *"$m"* ]] && { echo "$f"; break; }; done
    done
}

unpack() {
    mkdir -p "$ST/models"
    local p out
    compgen -G "$DEV/*.tgguf" > /dev/null || [ -n "${FILES:-}" ] || { say "no $DEV/*.tgguf: carry data/device"; return 2; }
    for p in ${FILES:-"$DEV"/*.tgguf}; do
        out=$ST/models/$(basename "$p" .tgguf).gguf
        if [ -f "$out" ] && [ -z "${CONTEXT:-}" ]; then say "$out: present"; continue; fi
        "$PY" scripts/speed_gguf.py unpack "$p" "$out" ${CONTEXT:+--context "$CONTEXT"} 2>&1 | tee -a "$LOG" >&2 \
            || return 2
    done
    "$PY" -c "import tokenizers, jinja2" 2>> "$LOG" || say "tinyllm needs tokenizers and jinja2 to open these files: \
pip download --only-binary :all: --python-version 3.12 -d .whl tokenizers jinja2 markupsafe, then carry .whl too"
}

# ---- the device: measurements --------------------------------------------------------------------
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2> /dev/null | head -1; }

metered() {  # metered CMD...: runs it (within the call's budget); $ST/vram: its peak GPU MiB over idle
    local base pid rc
    base=$(smi); : > "$ST/vram.samples"
    if [ -n "$base" ]; then (while :; do smi >> "$ST/vram.samples"; sleep 0.2; done) & pid=$!; fi
    timeout $(($(left) - 20)) "$@"; rc=$?
    if [ -n "$base" ]; then
        kill "$pid"; wait "$pid" 2> /dev/null
        local peak; peak=$(sort -n "$ST/vram.samples" | tail -1)
        echo $((${peak:-$base} - base)) > "$ST/vram"
    else
        echo null > "$ST/vram"
    fi
    return $rc
}

done_already() { [ -f "$RESULTS" ] && grep -qF "\"key\": \"$1\"" "$RESULTS"; }
variant() {  # what sets a tinyllm run apart: TINYLLM_ARGS and the TINYLLM_* switches
    { [ -n "${TINYLLM_ARGS:-}" ] && echo "$TINYLLM_ARGS"; env | grep '^TINYLLM_' | grep -v '^TINYLLM_ARGS=' | sort; } | paste -sd' '
}

llama() {  # llama-bench on each file: tg256, all layers on the GPU
    local kind=cuda ngl=99 n=256 r=3 f key
    if [ -n "$DRY" ]; then kind=cpu ngl=0 n=8 r=1; fi
    wait_build "$kind" || return $?
    for f in $(files); do
        key="llama.cpp|$(basename "$f")|$kind|${LLAMA_ARGS:-}"
        if done_already "$key"; then say "$key: measured"; continue; fi
        [ "$(left)" -gt 60 ] || { say "out of time: call again"; return 3; }
        say "llama-bench $(basename "$f")"
        # shellcheck disable=SC2086
        metered "$ST/build-$kind/bin/llama-bench" -m "$f" -ngl $ngl -p 0 -n $n -r $r -o jsonl $LLAMA_ARGS \
            > "$ST/llama.out" 2> "$ST/llama.err" || { say "llama-bench failed"; tail -20 "$ST/llama.err" | tee -a "$LOG" >&2; continue; }
        tail -5 "$ST/llama.err" >> "$LOG"
        "$PY" scripts/speed_gguf.py row llama.cpp "$key" "$f" "$ST/llama.out" "$(cat "$ST/vram")" >> "$RESULTS"
    done
}

tinyllm() {  # tinyllm's bench on each file: the plain step (compile off), then compiled
    local dev=cuda steps=256 r=3 f c key
    if [ -n "$DRY" ]; then dev=cpu steps=${DRY_STEPS:-8} r=1; fi
    if building; then say "waiting for the $(build_kind) build: it takes the cores a small model's step needs"; fi
    while building && [ "$(left)" -gt 90 ]; do sleep 5; done
    building && { say "a build still runs: call again"; return 3; }
    for f in $(files); do
        for c in ${COMPILES:-off on}; do
            key="tinyllm|$(basename "$f")|$dev/$c|$(variant)"
            if done_already "$key"; then say "$key: measured"; continue; fi
            [ "$(left)" -gt 60 ] || { say "out of time: call again"; return 3; }
            say "tinyllm bench $(basename "$f") --compile $c"
            # shellcheck disable=SC2086
            metered "$PY" scripts/speed_gguf.py bench --model "$f" --device $dev --steps $steps --repeats $r \
                --prompt-lens 16 --no-buckets --peers off --compile $c $TINYLLM_ARGS > "$ST/tinyllm.out" 2> "$ST/tinyllm.err"
            local rc=$?
            grep -v '^{' "$ST/tinyllm.err" | grep -iv warn | tail -25 >> "$LOG"
            if [ $rc -ne 0 ]; then
                say "tinyllm bench failed (rc $rc$([ $rc = 124 ] && echo ': out of time, call again'))"
                tail -20 "$ST/tinyllm.err" | tee -a "$LOG" >&2
                [ $rc = 124 ] && return 3
                continue
            fi
            "$PY" scripts/speed_gguf.py row tinyllm "$key" "$f" "$ST/tinyllm.out" "$(cat "$ST/vram")" >> "$RESULTS"
        done
    done
}

cpu() {  # the host's cores: llama-bench -t N against tinyllm's native step, both on the CPU build's files
    local f t key n=128 r=3
    [ -n "$DRY" ] && n=8 r=1
    wait_build cpu || return $?
    for f in $(files); do
        [[ $(basename "$f") == llama3.1-8b* ]] && [ -z "$DRY" ] && continue  # minutes a run on a CPU
        for t in ${CPU_THREADS:-4 8 15}; do
            key="llama.cpp|$(basename "$f")|cpu-t$t|${LLAMA_ARGS:-}"
            if ! done_already "$key" && [ "$(left)" -gt 60 ]; then
                # shellcheck disable=SC2086
                timeout $(($(left) - 20)) "$ST/build-cpu/bin/llama-bench" -m "$f" -t "$t" -p 0 -n $n -r $r -o jsonl \
                    $LLAMA_ARGS > "$ST/llama.out" 2> "$ST/llama.err" \
                    && "$PY" scripts/speed_gguf.py row llama.cpp "$key" "$f" "$ST/llama.out" null >> "$RESULTS"
            fi
            key="tinyllm|$(basename "$f")|cpu-t$t|$(variant)"
            if ! done_already "$key" && [ "$(left)" -gt 60 ]; then
                # shellcheck disable=SC2086
                timeout $(($(left) - 20)) "$PY" scripts/speed_gguf.py bench --model "$f" --device cpu --threads "$t" \
                    --quant keep --steps $n --repeats $r --prompt-lens 16 --no-buckets --compile off $TINYLLM_ARGS \
                    > "$ST/tinyllm.out" 2> "$ST/tinyllm.err" \
                    && "$PY" scripts/speed_gguf.py row tinyllm "$key" "$f" "$ST/tinyllm.out" null >> "$RESULTS"
            fi
            say "$(basename "$f") at $t threads: measured"
        done
    done
}

table() { "$PY" scripts/speed_gguf.py table "$RESULTS" --jsonl "$OUT/side_by_side_table.jsonl" | tee "$OUT/side_by_side.md"; }

dry() {  # every phase on this CPU, small: the 8B shape with 2 layers, 8 steps
    export DRY=1 ST
    "$PY" scripts/speed_gguf.py synth-llama8b --layers 2 "$ST/llama3.1-8b-shape-2l.q4_k_m.tgguf" || return 2
    FILES="${FILES:-"$DEV"/smollm2-135m.q4_1.tgguf} $ST/llama3.1-8b-shape-2l.q4_k_m.tgguf"
    export FILES JOBS=${JOBS:-2} BUDGET_S=100000 CONTEXT=${CONTEXT:-4096} MODELS=${MODELS:-smollm2 llama3.1} CPU_THREADS=${CPU_THREADS:-1 2}
    bash "$0" cpu-build unpack llama tinyllm cpu table
}

# ---- main ----------------------------------------------------------------------------------------
[ $# -gt 0 ] || { sed -n '2,33p' "$0"; exit 2; }
say "phases: $* (ST=$ST, $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 || echo no GPU))"
rc=0
for phase in "$@"; do
    case $phase in
        prepare) prepare ;;
        prune) prune ;;
        build) build cuda ;;
        cpu-build) build cpu ;;
        wait) wait_build "$(build_kind || { [ -n "$DRY" ] && echo cpu; } || echo cuda)" ;;
        unpack) unpack ;;
        llama) llama ;;
        tinyllm) tinyllm ;;
        cpu) cpu ;;
        table) table ;;
        dry) dry ;;
        *) say "unknown phase $phase"; false ;;
    esac
    rc=$?
    [ $rc -eq 0 ] || break
done
[ -f "$RESULTS" ] && cp "$RESULTS" "$OUT/side_by_side.jsonl"
say "end: rc $rc"
exit $rc
