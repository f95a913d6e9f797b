#!/usr/bin/env bash
# Teacher data on the H200 (issue 14): `python -m tinyllm.datagen` over SmolLM2-135M-Instruct.
# docs/DATA.md has the whole procedure; in short:
#
# The teacher GGUF (98 MB) is larger than what one device call carries (64 MiB including the
# working tree, of which models/tinychat is 41 MB), so it travels in parts over back-to-back
# calls (the machine stays warm ~30 s after a call) and is put together there:
#
#   here:    bash scripts/device_datagen.sh split 20        # .teacher/part-00..04 + .teacher/SHA256
#   device:  run(carry=[".teacher/SHA256", ".teacher/part-00"], command="bash scripts/device_datagen.sh receive")
#            ... the same for part-01 .. part-03, each call within the warm window of the last ...
#   device:  run(carry=[".teacher/SHA256", ".teacher/part-04"], command="MINUTES=8 bash scripts/device_datagen.sh gen")
#   device:  run(command="MINUTES=9 bash scripts/device_datagen.sh gen")   # more rounds, while warm
#   here:    cp the returned teacher-*.jsonl.xz, stats.json, state.json into data/teacher/
#
# `gen` receives a carried part (if any), assembles the teacher once all parts are there (checked
# against SHA256), generates into data/teacher/ ON THE DEVICE for MINUTES (resuming the rounds
# already there; TOKENS=60000000, SEED=0, ROUND=4000 first turns a round), packs the shards, and
# copies to $OUT: shards SHARD_FROM.. (default 0; 5 at most, as 8 files / 64 MiB come back per
# call), stats.json, state.json and log.txt.
set -u
cd "$(dirname "$0")/.."
GGUF=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PARTS=/root/teacher-parts  # outside the repository: kept across calls while the machine is warm

receive() {
  [ -f "$GGUF" ] && { echo "teacher present: $GGUF"; return 0; }
  mkdir -p "$PARTS"
  cp .teacher/part-* .teacher/SHA256 "$PARTS/" 2>/dev/null
  [ -f "$PARTS/SHA256" ] || { echo "no SHA256: carry .teacher/SHA256 with every part"; return 1; }
  have=$(ls "$PARTS"/part-* 2>/dev/null | wc -l)
  want=$(awk '{print $3}' "$PARTS/SHA256")
  [ "$have" -ge "$want" ] || { echo "have $have of $want parts"; return 1; }
  mkdir -p "$(dirname "$GGUF")"
  cat "$PARTS"/part-* > "$GGUF"
  if [ "$(sha256sum "$GGUF" | awk '{print $1}')" != "$(awk '{print $1}' "$PARTS/SHA256")" ]; then
    echo "sha256 mismatch: parts from two splits?"; rm -f "$GGUF"; return 1
  fi
  echo "teacher assembled: $GGUF"
}

case "${1:-gen}" in
  split)
    mkdir -p .teacher && rm -f .teacher/part-* .teacher/SHA256
    ex="$(git rev-parse --git-common-dir)/info/exclude"
    grep -qx '/.teacher/' "$ex" 2>/dev/null || echo '/.teacher/' >> "$ex"
    split -b "${2:-20}M" -d "$GGUF" .teacher/part-
    echo "$(sha256sum "$GGUF" | awk '{print $1}') $(basename "$GGUF") $(ls .teacher/part-* | wc -l)" > .teacher/SHA256
    ls -l .teacher
    ;;
  receive)
    receive || true
    ;;
  gen)
    export PYTHONUNBUFFERED=1 PYTHONPATH=.
    receive || { echo "teacher not complete: carry the remaining parts first"; exit 3; }
    log=$OUT/log.txt
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a "$log"
    minutes=${MINUTES:-8}
    timeout "$(python3 -c "print(int($minutes * 60 + 100))")" python3 -m tinyllm.datagen --teacher "$GGUF" \
      --device cuda --compile --tokens "${TOKENS:-60000000}" --seed "${SEED:-0}" --round-size "${ROUND:-4000}" \
      --minutes "$minutes" --out data/teacher --workers 12 >> "$log" 2>&1
    echo "datagen exit $?"
    grep -v '^{"round"' "$log" | tail -6
    grep '^{"round"' "$log" | tail -4
    i=0
    for s in data/teacher/teacher-*.jsonl.xz; do
      if [ "$i" -ge "${SHARD_FROM:-0}" ] && [ "$i" -lt $(( ${SHARD_FROM:-0} + 5 )) ]; then cp "$s" "$OUT/"; fi
      i=$((i + 1))
    done
    cp data/teacher/stats.json data/teacher/state.json "$OUT/" 2>/dev/null
    ls -l "$OUT"
    ;;
  *) echo "usage: $0 split [MB] | receive | gen"; exit 2 ;;
esac
