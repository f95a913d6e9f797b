#!/usr/bin/env bash
# PDL and the products' variants on the H200 (tinyllm.kernels.pdl, tinyllm.kernels.qgemv_triton;
# docs/BENCHMARKS-LOG.md, ninth session). Run from the repo root; $OUT gets tests.txt, summary.txt
# and logs.tgz (every run's JSON and stderr, Chrome traces of the first). One 10-minute call:
#  1. what this torch / Triton offer (Inductor's enable_pdl, Triton's gdc_wait);
#  2. the CUDA tests of the kernels and of the graphed decoders (TESTS_S seconds; TEST_FILES);
#  3. `tinyllm-bench --profile` of the TinyLlama-1.1B shape at int8 for each VARIANTS entry
#     (environment assignments, "-" for none): one step's replay time, plain and compiled;
#     the first compiles cold, the rest reuse Inductor's cache;
#  4. the same shape's decode speed (`--compile on`) under the variant with the fastest
#     compiled replay, for each of QUANTS.
# SWEEP_S > 0 first runs scripts/qgemv_sweep.py (block-size rules of the products, SWEEP_MODELS)
# and adds its three best 1.1B int8 rules to VARIANTS. PROF_S=0 skips step 3 and takes the
# fastest variant of an earlier call on the same warm machine (/tmp/best_variant). SMOL_GZ (a
# gzipped GGUF, carried) adds SmolLM2's decode speed for each of SMOL_QUANTS, under the sweep's
# best int4 rule where one was found (/tmp/best_int4).
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

if [ "${SWEEP_S:-0}" != 0 ]; then
  timeout "$SWEEP_S" python3 scripts/qgemv_sweep.py > $L/sweep.jsonl 2> $L/sweep.err
  echo "sweep rc=$?"; grep BEST $L/sweep.jsonl
  rules=$(grep '"step_matrix_us"' $L/sweep.jsonl | grep '"1.1b"' | head -3 | sed 's/.*"rule": "\([0-9,]*\)".*/\1/')
  for r in $rules; do VARIANTS="${VARIANTS:--} TINYLLM_QGEMV_BLOCKS=$r"; done
  grep '^BEST smollm2 int4' $L/sweep.jsonl | awk '{print $4}' > /tmp/best_int4
  grep '"step_matrix_us"' $L/sweep.jsonl > "$OUT/sweep_rules.jsonl"
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
[ "${PROF_S:-130}" = 0 ] && VARIANTS=""
for v in ${VARIANTS--}; do
  env_args=$(echo "$v" | tr ';' ' '); [ "$v" = "-" ] && env_args=""
  trace=""; [ $i = 0 ] && trace="TINYLLM_TRACE_DIR=$L/traces"
  env $env_args $trace timeout "${PROF_S:-130}" python3 -m tinyllm.tools.cli bench --preset tinyllama-1.1b --device cuda \
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
[ "$best" = "-" ] && [ -s /tmp/best_variant ] && [ "${PROF_S:-130}" = 0 ] && best=$(cat /tmp/best_variant)
echo "$best" > /tmp/best_variant
echo "fastest: [$best]"
for q in ${QUANTS:-int8}; do
  [ "${BENCH_S:-120}" = 0 ] && break
  env_args=$(echo "$best" | tr ';' ' '); [ "$best" = "-" ] && env_args=""
  env $env_args timeout "${BENCH_S:-120}" python3 -m tinyllm.tools.cli bench --preset tinyllama-1.1b --device cuda --quant "$q" \
      --compile on --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > $L/tinyllama_$q.jsonl 2> $L/tinyllama_$q.err
  echo "tinyllama $q [$best] rc=$?"; summarize
done
if [ -n "${SMOL_GZ:-}" ]; then
  zcat "$SMOL_GZ" > /tmp/smol.gguf
  rule=""; [ -s /tmp/best_int4 ] && rule="TINYLLM_QGEMV_BLOCKS=$(cat /tmp/best_int4)"
  for q in ${SMOL_QUANTS:-keep none}; do
    env $rule timeout "${BENCH_S:-120}" python3 -m tinyllm.tools.cli bench --model /tmp/smol.gguf --device cuda --quant "$q" \
        --compile on --peers off --steps 128 --repeats 3 --prompt-lens 128 --no-buckets > $L/smol_$q.jsonl 2> $L/smol_$q.err
    echo "smollm2 $q [$rule] rc=$?"; summarize
  done
fi
summarize; cat "$OUT/summary.txt"
