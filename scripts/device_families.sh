#!/usr/bin/env bash
# Issues 42 and 43 on the H200: the seed's API and every model family on the CUDA paths, then
# decode speed of each family's shape (random weights; no real weights travel).
#
#   run(carry=[".whl"], command="bash scripts/device_families.sh tests")
#       the wheels the image lacks (textual, platformdirs, pyte, gguf: .whl/, from
#       `pip download -d .whl textual platformdirs pyte gguf`, pure-Python ones only) into /tmp/site;
#       then -m cuda: tests/test_seed_api.py, tests/tinyllm/test_families.py, and the whole CUDA suite
#   run(carry=[".whl"], command="bash scripts/device_families.sh bench")
#       tinyllm-bench --preset P --device cuda for each family preset (tinyllm/model.py PRESETS):
#       $OUT/bench-P.jsonl
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-families-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1 || { echo "wheels failed"; tail -5 "$OUT/pip.log"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
case "${1:-tests}" in
  tests)
    # The whole CUDA suite, this issue's files first; the log and the failures' names to $OUT.
    timeout "${LIMIT:-540}" python3 -m pytest -q -rf -m cuda -p no:cacheprovider tests/test_seed_api.py \
      tests/tinyllm/test_families.py tests > "$OUT/cuda-tests.log" 2>&1
    echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda-tests.log" | tail -30
    ;;
  bench)
    for p in ${PRESETS:-llama3.2-1b qwen2.5-0.5b qwen3-0.6b gemma2-2b gemma3-270m phi3-mini}; do
      timeout "${EACH:-120}" python3 -m tinyllm.tools.cli bench --preset "$p" --device cuda --peers off --steps 256 \
        --repeats 2 --prompt-lens 128 ${FLAGS:---compile on} > "$OUT/bench-$p.jsonl" 2> "$OUT/bench-$p.err"
      echo "== $p exit $?"; grep -v -i warn "$OUT/bench-$p.err" | tail -12
    done
    ;;
esac
