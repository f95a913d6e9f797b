#!/usr/bin/env bash
# Issue 35 on the H200: the continuous engine's CUDA tests and its bench rows, then teacher data.
#
#   run(command="bash scripts/device_engine.sh check", timeout_s=600)
#       1. -m cuda: test_engine_cuda (graphs vs eager, generate(), no hidden sync), test_decode_attention
#          (the fused op by row length), test_cuda_graph_cuda (the decoders' shared base),
#          test_chat_decode (Readback), test_bench
#       2. tinyllm-bench --preset 125m --engine --concurrency 64,256,512 (compiled): $OUT/engine-125m.jsonl
#   The teacher (98 MB) travels in parts first (scripts/device_datagen.sh split / receive), then
#   run(carry=[".teacher/SHA256", ".teacher/part-04", ".dedup"], command="bash scripts/device_engine.sh teacher")
#       3. tinyllm-bench --model SmolLM2 --engine --engine-workload teacher --concurrency 256:
#          $OUT/engine-teacher.jsonl
#       4. datagen with SEED (default 12) into data/teacher-sSEED, deduplicated against data/teacher and
#          .dedup/teacher-s11-users.txt.xz (copy ../shared/data/teacher-s11/users.txt.xz there first),
#          256 slots, two rounds in flight, in the background for MINUTES (default 12); then
#          `WAIT=... DIR=data/teacher-s12 bash scripts/device_datagen.sh collect` in later calls.
# DEVICE=cpu runs steps 1-2 here (a dry run: the CUDA tests skip, the bench is the CPU's).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/device-engine-out}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
GGUF=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

case "${1:-check}" in
  check)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
    timeout 330 python3 -m pytest -q -m cuda -p no:cacheprovider tests/tinyllm/test_engine_cuda.py \
      tests/tinyllm/test_decode_attention.py tests/tinyllm/test_cuda_graph_cuda.py tests/tinyllm/test_chat_decode.py \
      tests/tinyllm/test_bench.py 2>&1 | tail -25
    conc=$([ "$DEVICE" = cuda ] && echo 64,256,512 || echo 2,4)
    steps=$([ "$DEVICE" = cuda ] && echo 256 || echo 4)
    timeout 240 python3 -m tinyllm.tools.cli bench --preset 125m --device "$DEVICE" --engine --concurrency "$conc" \
      --steps "$steps" --repeats 2 --compile on --peers off > "$OUT/engine-125m.jsonl" 2> "$OUT/engine-125m.err"
    echo "bench exit $?"; tail -30 "$OUT/engine-125m.err"
    ;;
  teacher)
    bash scripts/device_datagen.sh receive || { echo "teacher not complete: carry the remaining parts first"; exit 3; }
    timeout 200 python3 -m tinyllm.tools.cli bench --model "$GGUF" --device "$DEVICE" --engine --engine-workload teacher \
      --concurrency 256 --repeats 1 --compile on > "$OUT/engine-teacher.jsonl" 2> "$OUT/engine-teacher.err"
    echo "bench exit $?"; tail -12 "$OUT/engine-teacher.err"
    SEED=${SEED:-12}
    DIR=data/teacher-s$SEED SEED=$SEED SLOTS=256 ROUND=${ROUND:-8000} MINUTES=${MINUTES:-12} WAIT=${WAIT:-240} \
      EXTRA="--in-flight 2 --dedup-with data/teacher/users.txt.xz --dedup-with .dedup/teacher-s11-users.txt.xz" \
      bash scripts/device_datagen.sh start
    ;;
  *) echo "usage: $0 check | teacher"; exit 2 ;;
esac
