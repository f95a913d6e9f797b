#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-bench, llama-cli, llama-server, llama-quantize) from the
# sources that the PyPI sdist of llama-cpp-python==0.3.36 vendors under vendor/llama.cpp
# (ggml-org/llama.cpp@0c1e57098, per the sdist's CHANGELOG.md; gguf-py 0.19.0). PyPI is the only
# registry this project's machines reach, so the sdist is how llama.cpp gets here.
#
#   bash scripts/build_llama_cpp.sh [BUILD_DIR]      # default BUILD_DIR: /work/llama.cpp-build
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
set -euo pipefail
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
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
