#!/usr/bin/env bash
# The app's own speed (python -m chat_app.bench: the real app under Pilot beside the bare session) with
# chat_app from several commits, alternated in one run; tinyllm is this tree's for all of them, so only
# the app differs. Usage: bash scripts/app_ab.sh ROUNDS COMMIT... [-- BENCH OPTIONS] ("." is this tree).
#   bash scripts/app_ab.sh 3 e339c51^ . -- --tokens 256 --replies 3
# Prints each run's JSON lines prefixed with its commit; then the medians of decode_tok_s (app) and
# app_over_session per commit.
set -u
cd "$(dirname "$0")/.."
rounds=$1; shift
trees=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do trees+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
py=${PYTHON:-$PWD/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for c in "${trees[@]}"; do
  dir="$work/$(echo "$c" | tr -c 'a-zA-Z0-9\n' _)"
  mkdir -p "$dir"
  if [ "$c" = . ]; then cp -r chat_app "$dir/"; else git archive "$c" chat_app | tar -x -C "$dir"; fi
  ln -s "$PWD/tinyllm" "$dir/tinyllm"
  [ -d models ] && ln -s "$PWD/models" "$dir/models"
done
out="$work/runs.jsonl"
for r in $(seq "$rounds"); do
  for c in "${trees[@]}"; do
    dir="$work/$(echo "$c" | tr -c 'a-zA-Z0-9\n' _)"
    (cd "$dir" && PYTHONPATH="$dir" "$py" -c "import chat_app, sys; assert chat_app.__file__.startswith('$dir'), chat_app.__file__" \
      && PYTHONPATH="$dir" "$py" -m chat_app.bench "$@" 2>/dev/null) | sed "s/^/$c\t/" | tee -a "$out"
  done
done
"$py" - "$out" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    tree, _, rest = line.partition("\t")
    m = json.loads(rest)
    if m["metric"] in ("decode_tok_s", "app_over_session") and (m["metric"] != "decode_tok_s" or m["where"] == "app"):
        runs.setdefault((tree, m["metric"]), []).append(m["value"])
for (tree, metric), values in sorted(runs.items()):
    print(f"{tree:>12} {metric:>18}: median {statistics.median(values):.3f} of {len(values)} ({', '.join(f'{v:.3g}' for v in values)})")
PY
