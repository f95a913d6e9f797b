#!/usr/bin/env bash
# The products' block rules searched inside the compiled step on the H200 (scripts/step_rules.py;
# docs/BENCHMARKS.md, twelfth session). Run from the repo root; $OUT gets each search's JSON
# lines and stderr. RULES_S: seconds for the 1.1B int8 search; SMOL_GZ (a gzipped GGUF,
# carried): also SmolLM2 at int4 (the search) and bf16 (`tinyllm-bench --profile`, its kernels).
set -u
OUT=${OUT:-out}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout "${RULES_S:-300}" python3 scripts/step_rules.py --preset tinyllama-1.1b --quant int8 \
    > "$OUT/rules_1.1b.jsonl" 2> "$OUT/rules_1.1b.err"
echo "1.1b rc=$?"; grep -v '"shape"' "$OUT/rules_1.1b.jsonl"
if [ -n "${SMOL_GZ:-}" ]; then
  zcat "$SMOL_GZ" > /tmp/smol.gguf
  timeout "${SMOL_S:-150}" python3 scripts/step_rules.py --model /tmp/smol.gguf --quant keep \
      > "$OUT/rules_smol.jsonl" 2> "$OUT/rules_smol.err"
  echo "smol rc=$?"; grep -v '"shape"' "$OUT/rules_smol.jsonl"
  timeout "${BF16_S:-90}" python3 -m tinyllm.bench --model /tmp/smol.gguf --device cuda --quant none --profile \
      > "$OUT/smol_bf16_profile.jsonl" 2> "$OUT/smol_bf16_profile.err"
  echo "smol bf16 rc=$?"; grep replay_us "$OUT/smol_bf16_profile.jsonl"
fi
