#!/usr/bin/env bash
# PDL and the products' variants on the H200 (tinyllm.pdl, tinyllm.qgemv_triton;
# docs/BENCHMARKS.md, ninth session). Run from the repo root; $OUT gets tests.txt, summary.txt
# and logs.tgz (every run's JSON and stderr, Chrome traces of the first). One 10-minute call:
#  1. what this torch / Triton offer (Inductor's enable_pdl, Triton's gdc_wait);
#  2. the CUDA tests of the kernels and of the graphed decoders (TESTS_S seconds; TEST_FILES);
#  3. `tinyllm-bench --profile` of the TinyLlama-1.1B shape at int8 for each VARIANTS entry
#     (environment assignments, "-" for none): one step's replay time, plain and compiled;
#     the first compiles cold, the rest reuse Inductor's cache;
#  4. the same shape's decode speed (`--compile on`) under the variant with the fastest
#     compiled replay, for each of QUANTS.
set -u
OUT=${OUT:-out}
L=/tmp/logs
mkdir -p "$OUT" $L/traces
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > $L/gpu.txt 2>&1
python3 - <<'PY' | tee $L/probe.txt
import torch, triton, triton.language as tl, torch._inductor.config as c
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)
print("inductor enable_pdl:", hasattr(c.triton, "enable_pdl"), "gdc_wait:", hasattr(tl.extra.cuda, "gdc_wait"))
PY

if [ "${TESTS_S:-100}" != 0 ]; then
  timeout -s INT "${TESTS_S:-100}" python3 -m pytest -v -rfs --tb=short -m cuda ${TEST_FILES:-tests/tinyllm/test_qgemv.py \
      tests/tinyllm/test_quant_cuda.py tests/tinyllm/test_decode_attention.py tests/tinyllm/test_cuda_graph_cuda.py \
      tests/tinyllm/test_engine_cuda.py tests/tinyllm/test_chat_decode.py} \
      > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E " passed| failed|FAILED|Error" "$OUT/tests.txt" | tail -12
fi

summarize() {  # after each run, so a call that runs out of time still brings back what finished
  python3 - $L <<'PY' > "$OUT/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    v = f.with_suffix(".variant")
    for line in f.read_text().splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("metric") in ("decode_tok_s", "replay_us", "kernels_per_step", "weights_mib", "bandwidth_gb_s"):
            print(f.stem, v.read_text().strip() if v.exists() else "", r["metric"], r.get("impl", ""),
                  r.get("window", ""), round(r["value"], 1))
PY
  tar czf "$OUT/logs.tgz" -C /tmp logs
}

i=0
for v in ${VARIANTS:--}; do
  env_args=$(echo "$v" | tr ';' ' '); [ "$v" = "-" ] && env_args=""
  trace=""; [ $i = 0 ] && trace="TINYLLM_TRACE_DIR=$L/traces"
  env $env_args $trace timeout "${PROF_S:-130}" python3 -m tinyllm.bench --preset tinyllama-1.1b --device cuda \
      --quant int8 --profile > $L/profile_$i.jsonl 2> $L/profile_$i.err
  echo "$i [$v] rc=$? compiled replay_us: $(grep '"compiled"' $L/profile_$i.jsonl | grep replay_us | sed 's/.*"value": \([0-9.]*\).*window": \([0-9]*\).*/W=\2 \1/' | tr '\n' ' ')"
  echo "$v" > $L/profile_$i.variant
  i=$((i + 1)); summarize
done
best=$(python3 - $L <<'PY'
import json, pathlib, sys
best = (1e9, "-")
for f in pathlib.Path(sys.argv[1]).glob("profile_*.jsonl"):
    us = [json.loads(l)["value"] for l in f.read_text().splitlines()
          if l.startswith("{") and '"replay_us"' in l and '"compiled"' in l]
    if us:
        best = min(best, (max(us), f.with_suffix(".variant").read_text().strip()))
print(best[1])
PY
)
echo "fastest: [$best]"
for q in ${QUANTS:-int8}; do
  [ "${BENCH_S:-120}" = 0 ] && break
  env_args=$(echo "$best" | tr ';' ' '); [ "$best" = "-" ] && env_args=""
  env $env_args timeout "${BENCH_S:-120}" python3 -m tinyllm.bench --preset tinyllama-1.1b --device cuda --quant "$q" \
      --compile on --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > $L/tinyllama_$q.jsonl 2> $L/tinyllama_$q.err
  echo "tinyllama $q [$best] rc=$?"; summarize
done
summarize; cat "$OUT/summary.txt"
