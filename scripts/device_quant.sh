#!/usr/bin/env bash
# Quantized weights on the H200 (docs/BENCHMARKS.md, "Quantized weights"). Run from the repo
# root with PYTHONPATH=. ; results go to $OUT (default ./out). About 5 minutes.
#  1. the quantized tests, CUDA ones included (graph replay of the quantized step equals its
#     eager run; kernels against the dequantized reference on the GPU);
#  2. the TinyLlama-1.1B shape, bf16 vs int8 vs int4, compiled step in CUDA graphs;
#  3. SmolLM2-135M Q4_1 GGUF (if data/smollm2/ holds it): bf16 load vs kept quantized.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

timeout 150 python3 -m pytest -q -rs tests/tinyllm/test_quant.py tests/tinyllm/test_quant_gguf.py \
    tests/tinyllm/test_quant_cuda.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/tests.txt"

# Each quant in its own process (same script run, back to back), the compiled step in graphs.
for q in none int8 int4; do
  timeout 70 python3 -m tinyllm.bench --preset tinyllama-1.1b --device cuda --quant "$q" --compile on \
      --peers off --steps 128 --repeats 3 --prompt-lens 128 > "$OUT/tinyllama_$q.jsonl" 2> "$OUT/tinyllama_$q.err"
done

G=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$G" ]; then
  for q in none keep int8; do
    timeout 50 python3 -m tinyllm.bench --model "$G" --device cuda --quant "$q" --compile on --peers off \
        --steps 128 --repeats 3 --prompt-lens 128 > "$OUT/smollm2_$q.jsonl" 2> "$OUT/smollm2_$q.err"
  done
else
  echo "no $G: SmolLM2 part not run" > "$OUT/smollm2_missing.txt"
fi

python3 - "$OUT" <<'EOF' > "$OUT/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        r = json.loads(line)
        if r["metric"] in ("decode_tok_s", "weights_mib", "ttft_ms"):
            print(f.stem, r["metric"], r.get("impl", ""), r["value"])
EOF
cat "$OUT/summary.txt"; tail -3 "$OUT/tests.txt"
