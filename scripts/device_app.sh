#!/usr/bin/env bash
# The H200 side of issues 10 and 11 (docs/BENCHMARKS-LOG.md, "The app itself"), one step per call
# of this script, so a device call chains as many as fit in its 10 minutes. Run from the repo
# root; results go to $OUT. The device image has no textual/platformdirs: they travel as
# wheels in .whl/ (device/README.md), installed by `setup`.
#
#   setup                         install the wheels into /tmp/site; join /tmp/g/part* (the
#                                 SmolLM2 GGUF, sent in parts) into data/smollm2/
#   app MODEL RUNS TOKENS LIMIT   python -m chat_app.bench once per run in RUNS ("cold warm":
#                                 the second launch finds the compile in the cache), LIMIT s each
#   preset NAME DST               a checkpoint of a preset's shape, random bf16 weights
#   tests LIMIT                   the CUDA tests (-m cuda)
#   lib LIMIT TAG ARGS...         tinyllm-bench ARGS (the library's own numbers)
#   ab OLD MODEL TOKENS LIMIT N   the app bench of this tree and of OLD (a `git archive` of an
#                                 earlier commit's tinyllm/ and chat_app/), alternated N times
#                                 after one cold run each: a refactor's before and after, one machine
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TINYLLM_CHAT_DATA_DIR=/tmp/chatdata
# The device image's torch ships no bytecode (.pyc), so every module Dynamo and Inductor
# import is compiled from source on each launch (4.3 s of a warm compile, and GIL held while
# it runs); a pip install writes them. Keep them in one writable place, so a "warm" run sees
# what a user's second launch sees (the "cold" run starts without them).
export PYTHONPYCACHEPREFIX=/tmp/pyc
tag() { basename "$1" | tr -c 'A-Za-z0-9_\n-' _; }
step=$1; shift
case $step in
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  if compgen -G "/tmp/g/part*" > /dev/null; then
    mkdir -p data/smollm2 && cat /tmp/g/part* > data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum data/smollm2/*.gguf
  fi
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
  PYTHONDONTWRITEBYTECODE=1 python3 -c "import torch, pathlib; d = pathlib.Path(torch.__file__).parent; print('torch', torch.__version__, 'pyc files:', sum(1 for _ in d.rglob('*.pyc')), 'py files:', sum(1 for _ in d.rglob('*.py')))"
  ;;
app)
  model=$1 runs=$2 tokens=$3 limit=$4; t=$(tag "$model")
  for run in $runs; do
    timeout "$limit" python3 -m chat_app.bench --model "$model" --device cuda --tokens "$tokens" --replies 3 \
        > "$OUT/app_${t}_$run.jsonl" 2> "$OUT/app_${t}_$run.err"
    echo "== app $t $run rc=$?"
    grep -A30 "^metric" "$OUT/app_${t}_$run.err" | grep -v "^metric"
    [ -s "$OUT/app_${t}_$run.jsonl" ] || tail -5 "$OUT/app_${t}_$run.err"
    tail -c 2000 /tmp/chatdata/session.log > "$OUT/session_${t}_$run.log" 2>/dev/null
  done
  ;;
preset)
  python3 - "$1" "$2" <<'EOF'
import sys, torch
from tinyllm.tools.bench import random_model
from tinyllm.formats.checkpoint import save_checkpoint
from tinyllm.text.tokenizer import Tokenizer
model = random_model(sys.argv[1], torch.device("cuda"), torch.bfloat16)
save_checkpoint(model, Tokenizer.load("models/tinychat/tokenizer.model"), sys.argv[2], name=sys.argv[1],
                chat={"template": "chatml", "stop": ["<|im_end|>"]}, shard_mb=4000)
print("wrote", sys.argv[2])
EOF
  ;;
tests)
  timeout "$1" python3 -m pytest -q -rfs --tb=short -m cuda tests/tinyllm > "$OUT/cuda_tests.txt" 2>&1
  echo "== tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/cuda_tests.txt" | tail -12
  ;;
lib)
  limit=$1 t=$2; shift 2
  timeout "$limit" python3 -m tinyllm.tools.cli bench "$@" > "$OUT/lib_$t.jsonl" 2> "$OUT/lib_$t.err"
  echo "== lib $t rc=$?"; grep -E '"(decode_tok_s|weights_mib|rss_mib)"' "$OUT/lib_$t.jsonl" | cut -c1-170
  ;;
ab)
  old=$1 model=$(realpath "$2") tokens=$3 limit=$4 n=$5
  for run in cold $(seq "$n"); do
    for side in new old; do
      dir=.; [ "$side" = old ] && dir=$old
      (cd "$dir" && TINYLLM_CHAT_DATA_DIR=/tmp/chatdata-$side timeout "$limit" python3 -m chat_app.bench --model "$model" --device cuda --tokens "$tokens" \
          --replies 3 > "$OUT/ab_${side}_$run.jsonl" 2> "$OUT/ab_${side}_$run.err")
      echo "== ab $side $run rc=$?"
      grep -A30 "^metric" "$OUT/ab_${side}_$run.err" | grep -v "^metric"
    done
  done
  ;;
*) echo "unknown step $step"; exit 2 ;;
esac
