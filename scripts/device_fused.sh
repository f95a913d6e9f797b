#!/usr/bin/env bash
# Issue 50 on the device: the fused decode step (this tree) against the tree before it (OLD), on
# one card, in phases that each fit a 10-minute call (docs/BENCHMARKS.md, "The fused decode step").
# Here, once: git archive d2313ff tinyllm chat_app | gzip > data/device/old.tar.gz, the wheels in
# .whl/ (device/README.md), and scripts/gpu_side_by_side.sh's files in data/device.
#   setup            wheels into /tmp/site; OLD unpacked into /tmp/old; the card
#   tests LIMIT [PATHS...]  the CUDA suite (-m cuda) of this tree (of PATHS, in their order: the
#                    newest code's tests first, in case the call runs out): $OUT/cuda_tests.txt
#   lib LIMIT TAG SIDE ARGS...   tinyllm bench ARGS with this tree (SIDE new) or OLD (old):
#                    the plain step (graph_plain: a launch's first replies) and the compiled step
#   shape SRC DST [CONVERT ARGS]  a checkpoint of SRC's shape (its config.json, tokenizer and template)
#                    with random weights, converted with `tinyllm convert ARGS` (SRC's weight forms, from
#                    its README): speed-equivalent to SRC (the default model's 76 MB cannot travel)
#   app LIMIT SIDE COMPILE MODEL the app itself (python -m chat_app.bench, Pilot, headless) and its
#                    session without a UI, in one process, --compile COMPILE (on: today's default)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc
step=$1; shift
side_dir() { if [ "$1" = old ]; then echo /tmp/old; else pwd; fi; }
case $step in
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  old=${OLD_TAR:-data/device/old.tar.gz}  # the tree before, where carried (side old)
  [ -f "$old" ] && rm -rf /tmp/old && mkdir -p /tmp/old && tar -xzf "$old" -C /tmp/old && ln -sfn "$PWD/models" /tmp/old/models
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  ;;
tests)
  limit=$1; shift
  timeout "$limit" python3 -m pytest -v -rfs --tb=short --durations=15 -m cuda "${@:-tests}" > "$OUT/cuda_tests.txt" 2>&1
  echo "== tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.txt" | grep -v PASSED | tail -25
  ;;
shape)
  src=$1 dst=$2; shift 2
  python3 - "$src" "$dst.bf16" <<'EOF'
import json, sys, torch
from pathlib import Path
from tinyllm.model import ModelConfig, Transformer
from tinyllm.formats.checkpoint import save_checkpoint
from tinyllm.text.tokenizer import Tokenizer
src, dst = Path(sys.argv[1]), sys.argv[2]
raw = json.loads((src / "config.json").read_text())
torch.manual_seed(0)
with torch.device("cuda"):
    model = Transformer(ModelConfig(**raw["model"]))
with torch.no_grad():
    for name, p in model.named_parameters():
        p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
save_checkpoint(model.to(torch.bfloat16), Tokenizer.load(src / "tokenizer.model"), dst, name=raw["name"],
                chat=raw.get("chat"), shard_mb=4000)
print("wrote", dst, sum(p.numel() for p in model.parameters()), "parameters")
EOF
  python3 -m tinyllm.tools.cli convert "$dst.bf16" "$dst" "$@" && du -sh "$dst"
  ;;
lib)
  limit=$1 t=$2 side=$3; shift 3
  (cd "$(side_dir "$side")" && PYTHONPATH=/tmp/site:. timeout "$limit" python3 -m tinyllm.tools.cli bench "$@" \
      > "$OUT/lib_${t}_$side.jsonl" 2> "/tmp/lib_${t}_$side.err")
  echo "== lib $t $side rc=$?"
  grep -hE '"(graph_plain|graph_compiled|kernels_per_step|replay_us|weights_mib|decode_tok_s)' "$OUT/lib_${t}_$side.jsonl" \
      | cut -c1-200
  [ -s "$OUT/lib_${t}_$side.jsonl" ] || tail -5 "/tmp/lib_${t}_$side.err"
  cat "$OUT/lib_${t}_$side.jsonl" >> "$OUT/lib.jsonl"; rm "$OUT/lib_${t}_$side.jsonl"
  ;;
app)
  limit=$1 side=$2 compile=$3 model=$(realpath "$4")
  (cd "$(side_dir "$side")" && PYTHONPATH=/tmp/site:. TINYLLM_CHAT_DATA_DIR=/tmp/chatdata-$side timeout "$limit" \
      python3 -m chat_app.bench --model "$model" --device cuda --tokens 512 --replies 3 --compile "$compile" \
      > "/tmp/app_$side.jsonl" 2> "/tmp/app_$side.err")
  echo "== app $side compile=$compile rc=$?"
  grep -A30 "^metric" "/tmp/app_$side.err" | grep -v "^metric"; grep "^status bar" "/tmp/app_$side.err"
  cp "/tmp/app_$side.err" "$OUT/app_${side}_$compile.err"
  [ -s "/tmp/app_$side.jsonl" ] || tail -5 "/tmp/app_$side.err"
  sed "s/^{/{\"side\": \"$side\", \"compile\": \"$compile\", /" "/tmp/app_$side.jsonl" >> "$OUT/app.jsonl"
  ;;
*) echo "unknown step $step"; exit 2 ;;
esac
