#!/usr/bin/env bash
# Teacher data on the H200 (issue 14): `tinyllm datagen` over SmolLM2-135M-Instruct.
# docs/DATA.md has the whole procedure; in short:
#
# The teacher GGUF (98 MB) is larger than what one device call carries (64 MiB including the
# working tree, of which models/tinychat is 41 MB), so it travels in parts over back-to-back
# calls (the machine stays warm ~30 s after a call) and is put together there:
#
#   here:    bash scripts/device_datagen.sh split 20        # .teacher/part-00..04 + .teacher/SHA256
#   device:  run(carry=[".teacher/SHA256", ".teacher/part-00"], command="bash scripts/device_datagen.sh receive")
#            ... the same for part-01 .. part-03, each call within the warm window of the last ...
#   device:  run(carry=[".teacher/SHA256", ".teacher/part-04"], command="MINUTES=26 bash scripts/device_datagen.sh start")
#   device:  run(command="WAIT=560 bash scripts/device_datagen.sh collect")   # again, back to back, until done
#   here:    cp the returned teacher-*.jsonl.xz, stats.json, state.json into $DIR/
#
# Modes:
#   receive  keep a carried part outside the repository; assemble the teacher once all parts are
#            there (checked against SHA256)
#   start    receive, then start the generator in the background (setsid: it outlives the call
#            while the machine is held; one model load and one compile for the whole run) for
#            MINUTES, then collect after WAIT seconds (default 480)
#   collect  sleep WAIT (default 0), pack the rounds written so far, copy to $OUT: shards
#            SHARD_FROM.. (default 0; 3 at most: 8 files, 64 MiB come back per call),
#            stats.json, state.json, users.txt.xz (for --dedup-with of a later run), log.txt
#   gen      the same in the foreground for MINUTES (default 8), then collect
# Settings: DIR (data/teacher: the run's folder; a later run on a fresh machine needs its own, e.g.
# DIR=data/teacher1 SEED=1 EXTRA="--dedup-with data/teacher/users.txt.xz": data/teacher holds the
# committed shards, and packing into it would replace them), TOKENS (60000000), SEED (0), ROUND (4000 first turns a round), SLOTS (64 engine rows), EXTRA (more flags, e.g.
# "--dedup-with .teacher/users.txt.xz" on a fresh machine after an earlier run with SEED=0).
set -u
cd "$(dirname "$0")/.."
GGUF=data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
DIR=${DIR:-data/teacher}
PARTS=${PARTS:-/root/teacher-parts}  # outside the repository: kept across calls while the machine is warm

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

datagen() {  # generate into $DIR for $1 minutes, no packing
  python3 -m tinyllm.tools.cli datagen --teacher "$GGUF" --device cuda --compile --tokens "${TOKENS:-60000000}" \
    --seed "${SEED:-0}" --round-size "${ROUND:-4000}" --slots "${SLOTS:-64}" --minutes "$1" --out "$DIR" --no-pack ${EXTRA:-}
}

collect() {
  sleep "${WAIT:-0}"
  python3 -m tinyllm.tools.cli datagen --pack-only --out "$DIR" --workers 12 | tail -1
  cp "$DIR/users.txt.xz" "$OUT/" 2>/dev/null
  grep -v '^{"round"' "$DIR.log" | tail -4
  grep '^{"round"' "$DIR.log" | tail -3
  i=0
  for s in "$DIR"/teacher-*.jsonl.xz; do
    if [ "$i" -ge "${SHARD_FROM:-0}" ] && [ "$i" -lt $(( ${SHARD_FROM:-0} + 3 )) ]; then cp "$s" "$OUT/"; fi
    i=$((i + 1))
  done
  cp "$DIR/stats.json" "$DIR/state.json" "$OUT/" 2>/dev/null
  cp "$DIR.log" "$OUT/log.txt"
  ls -l "$OUT"
}

export PYTHONUNBUFFERED=1 PYTHONPATH=.
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
  start)
    receive || { echo "teacher not complete: carry the remaining parts first"; exit 3; }
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    mkdir -p "$DIR"
    setsid nohup bash -c "$(declare -f datagen); GGUF=$GGUF DIR=$DIR TOKENS=${TOKENS:-60000000} SEED=${SEED:-0} \
      ROUND=${ROUND:-4000} SLOTS=${SLOTS:-64} EXTRA='${EXTRA:-}' datagen ${MINUTES:-26}" >> "$DIR.log" 2>&1 < /dev/null &
    WAIT=${WAIT:-480} collect
    ;;
  collect)
    collect
    ;;
  gen)
    receive || { echo "teacher not complete: carry the remaining parts first"; exit 3; }
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    mkdir -p "$DIR"
    timeout "$(python3 -c "print(int(${MINUTES:-8} * 60 + 60))")" bash -c "$(declare -f datagen); GGUF=$GGUF DIR=$DIR datagen ${MINUTES:-8}" \
      >> "$DIR.log" 2>&1
    echo "datagen exit $?"
    collect
    ;;
  *) echo "usage: $0 split [MB] | receive | start | collect | gen"; exit 2 ;;
esac
