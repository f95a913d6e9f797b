#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-bench, llama-cli, llama-server, llama-quantize) from the
# sources that the PyPI sdist of llama-cpp-python==0.3.36 vendors under vendor/llama.cpp
# (ggml-org/llama.cpp@0c1e57098, per the sdist's CHANGELOG.md; gguf-py 0.19.0). PyPI is the only
# registry this project's machines reach, so the sdist is how llama.cpp gets here.
#
#   bash scripts/build_llama_cpp.sh [BUILD_DIR]      # default BUILD_DIR: /work/llama.cpp-build
#   bash scripts/build_llama_cpp.sh --server [DIR]   # llama-server alone, portable, cached (below)
#
# Idempotent: the sdist is downloaded and unpacked only when $LLAMA_CPP_SRC (default
# /work/llama.cpp-src, outside the repo) lacks vendor/llama.cpp; cmake re-configures and
# rebuilds only what changed.
# Binaries land in BUILD_DIR/bin. Needs cmake (>= 3.14) and a C++17 compiler; 2 cores take
# roughly 15-25 minutes for a clean build.
#
# sdist: llama_cpp_python-0.3.36.tar.gz, 76,589,250 bytes,
#   sha256 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
#
# The cmake line, as run:
#   cmake -S $SRC/vendor/llama.cpp -B BUILD_DIR -G Ninja -DCMAKE_BUILD_TYPE=Release
#         -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX"
#         -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
#         -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
#   cmake --build BUILD_DIR -j2 --target llama-bench llama-cli llama-server llama-quantize
# with NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" (gcc keeps explicit -mno- flags over
# -march=native). The project's CPU reports AMX in cpuinfo but its VM faults on the tile
# instructions: a plain -march=native build dies with SIGILL (ldtilecfg in
# ggml_backend_amx_mul_mat) as soon as a batch of more than one token is multiplied, i.e. on
# any prompt; llama-bench -p 0 alone survives. Set NOAMX= (empty) on a machine where AMX works.
# No network at build time: the server's prebuilt web UI download and HTTPS are switched off.
#
# convert_hf_to_gguf.py from the same sources runs with the repo venv as it is (torch,
# numpy, safetensors, sentencepiece, transformers and gguf 0.19.0 are there; nothing more to
# install); the script puts its own gguf-py on sys.path unless NO_LOCAL_GGUF is set, and
# PYTHONPATH makes that explicit. Checked with --help and by converting a 2-layer random
# LlamaForCausalLM saved by transformers, with models/tinychat/tokenizer.model, to f32:
#   PYTHONPATH=/work/llama.cpp-src/vendor/llama.cpp/gguf-py \
#     .venv/bin/python /work/llama.cpp-src/vendor/llama.cpp/convert_hf_to_gguf.py HF_DIR \
#     --outtype f32 --outfile OUT.gguf        # outtypes: f32 f16 bf16 q8_0 tq1_0 tq2_0 auto
# (requirements-convert_hf_to_gguf.txt pins transformers 4.57.6 and torch 2.11; the venv's
# transformers 5.x and torch 2.13 worked for that check.)
#
# --server: llama-server alone, for the tests that talk to a real OpenAI-compatible server
# (tests/llama_server.py; .ci/run calls this). It differs from the default build in three ways:
# - portable: -DGGML_NATIVE=OFF with an explicit x86-64 baseline of SSE4.2, AVX, AVX2, FMA, F16C
#   and BMI2 (ggml's own "haswell" CPU variant: Intel Haswell, AMD Zen and later), no AVX-512 and
#   no AMX (the VM's SIGILL above cannot happen: objdump finds no zmm or tile instruction in the
#   binary). A binary cached on one CI host therefore runs on another x86-64 host with AVX2.
#   ggml's runtime CPU-variant dispatch (GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS) is not
#   used: it compiles the CPU backend once for each of its 14 x86 variants, and its
#   sapphirerapids variant would pick AMX on this VM.
# - static (-DBUILD_SHARED_LIBS=OFF): one self-contained file (libstdc++ and libgomp from the
#   system), so only the binary is kept.
# - cached: DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/tinyllm-ci/llama-server-VERSION-HASH,
#   HASH the first 12 hex digits of the sha256 of the cmake flags below, so a change of version
#   or flags builds anew beside the old. When DIR/bin/llama-server answers --version nothing is
#   built. Otherwise the build runs in a temporary folder (removed after) and DIR/bin/llama-server
#   appears only once whole (a copy, then a rename). The path of the binary is all it prints on
#   stdout; everything else goes to stderr. Needs cmake and ninja on PATH.
set -euo pipefail
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SERVER=0
if [ "${1:-}" = --server ]; then SERVER=1; shift; exec 3>&1 1>&2; fi  # stdout (fd 3): the path alone
BUILD=${1:-/work/llama.cpp-build}
SRC=${LLAMA_CPP_SRC:-/work/llama.cpp-src}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
[ -x "$PY" ] || PY=python3

if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
    tarball="$tmp/llama_cpp_python-$VERSION.tar.gz"
    echo "$SHA256  $tarball" | sha256sum -c -
    mkdir -p "$SRC"
    tar -xzf "$tarball" -C "$SRC" --strip-components=1
    rm -rf "$tmp"
    trap - EXIT
fi

if [ "$SERVER" = 1 ]; then
    flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
           -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
           -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
           -DGGML_BACKEND_DL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
           -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF)
    hash=$(printf '%s\n' "${flags[@]}" | sha256sum | cut -c1-12)
    DIR=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tinyllm-ci/llama-server-$VERSION-$hash}
    if ! "$DIR/bin/llama-server" --version > /dev/null 2>&1; then
        tmp_build=$(mktemp -d)
        trap 'rm -rf "$tmp_build"' EXIT
        cmake -S "$SRC/vendor/llama.cpp" -B "$tmp_build" "${flags[@]}"
        cmake --build "$tmp_build" -j2 --target llama-server
        mkdir -p "$DIR/bin"
        cp "$tmp_build/bin/llama-server" "$DIR/bin/llama-server.part.$$"
        mv -f "$DIR/bin/llama-server.part.$$" "$DIR/bin/llama-server"
        "$DIR/bin/llama-server" --version
    fi
    echo "$DIR/bin/llama-server" >&3
    exit 0
fi

NOAMX=${NOAMX--mno-amx-tile -mno-amx-int8 -mno-amx-bf16}
gen=()
[ -f "$BUILD/CMakeCache.txt" ] || { command -v ninja > /dev/null && gen=(-G Ninja); }
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$BUILD" -j2 --target llama-bench llama-cli llama-server llama-quantize
ls -l "$BUILD"/bin/llama-bench "$BUILD"/bin/llama-cli "$BUILD"/bin/llama-server "$BUILD"/bin/llama-quantize
