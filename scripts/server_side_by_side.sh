#!/usr/bin/env bash
# The app as a client of llama-server (issue 45), beside llama-bench on the same GGUF, in one run:
# llama-bench (tg128, 2 threads), then llama-server (2 threads, --ignore-eos: fixed-length replies)
# with `python -m chat_app.bench --model http://127.0.0.1:PORT/v1` (the real app under Pilot,
# then a ServerSession without a UI: TTFT and tok/s as the client sees them), then llama-bench again.
#
#   bash scripts/server_side_by_side.sh [GGUF]     # default: data/smollm2/*.gguf
#
# Binaries: $LLAMA_CPP_BIN (default /work/llama.cpp-build/bin: scripts/build_llama_cpp.sh).
set -eu
cd "$(dirname "$0")/.."
gguf=${1:-$(ls data/smollm2/*.gguf | head -1)}
bin=${LLAMA_CPP_BIN:-/work/llama.cpp-build/bin}
port=${PORT:-18600}
bench() { "$bin/llama-bench" -m "$gguf" -t 2 -n 128 -p 0 -r 3 -o jsonl 2>/dev/null | grep -o '"avg_ts": [0-9.]*'; }
echo "== llama-bench tg128 (before)"; bench
"$bin/llama-server" -m "$gguf" --port "$port" -t 2 -c 2048 --jinja --no-webui --ignore-eos > /tmp/side-by-side-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.5; done
echo "== the app against llama-server (python -m chat_app.bench, 128 tokens a reply)"
.venv/bin/python -m chat_app.bench --model "http://127.0.0.1:$port/v1" --tokens 128 --replies 3 2>&1 >/dev/null | tail -12
kill $server; wait $server 2>/dev/null || true
echo "== llama-bench tg128 (after)"; bench
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
