#!/usr/bin/env bash
# One H200 call: train the default model (s512x6), then benchmark it and the preset shapes.
# Everything but the model and runs.jsonl goes to $OUT/log.txt (the call returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
log=$OUT/log.txt
python3 scripts/device_train.py --shape s512x6 --final-minutes "${MINUTES:-2.25}" > "$log" 2>&1
echo "== train exit $?" >> "$log"
bench() { echo "== tinyllm-bench $*" >> "$log"; timeout "$1" python3 -m tinyllm.bench "${@:2}" >> "$log" 2>&1; echo "== exit $?" >> "$log"; }
bench 60 --model "$OUT/model" --repeats 3 --peers off
bench 40 --model "$OUT/model" --chat-turns 20
bench 80 --preset 125m --repeats 3 --peers on
bench 110 --preset tinyllama-1.1b --repeats 3 --steps 128 --peers on
bench 70 --preset 125m --engine --repeats 2 --steps 64
grep -E '^(SWEEP|FINAL|==)|"metric"|error|Error' "$log" | cut -c1-220 | tail -80
