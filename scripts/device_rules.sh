#!/usr/bin/env bash
# The products' block rules and the attention's one-pass threshold searched inside the compiled
# step on the H200 (scripts/step_rules.py; docs/BENCHMARKS-LOG.md, twelfth session), the CUDA tests
# and the benches. Run from the repo root; $OUT gets every output. Steps, each skipped at 0:
#   TESTS_S  the CUDA tests of TEST_FILES;
#   RULES_S  step_rules.py on the 1.1B shape at int8 (SEARCH_ARGS);
#   SMOL_S   the same on SmolLM2 (needs SMOL_GZ, a gzipped GGUF, carried), once for each of
#            SMOL_RUNS ("QUANT[:VAR=VALUE] ...", default keep: int4), SEARCH_SMOL or SEARCH_ARGS;
#   BENCH_S  `tinyllm-bench --compile on` tok/s: the 1.1B at int8 and bf16, SmolLM2 (SMOL_GZ)
#            kept int4 and bf16 (or BENCH_RUNS, "MODEL:QUANT[:VAR=VALUE] ...": a run may set
#            one environment variable), each in its own process, BENCH_S seconds each.
set -u
OUT=${OUT:-out}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
[ -n "${SMOL_GZ:-}" ] && zcat "$SMOL_GZ" > /tmp/smol.gguf
if [ "${TESTS_S:-0}" != 0 ]; then
  timeout -s INT "$TESTS_S" python3 -m pytest -v -rfs --tb=short -m cuda ${TEST_FILES:-tests/tinyllm/test_decode_attention.py \
      tests/tinyllm/test_qgemv.py tests/tinyllm/test_quant_cuda.py tests/tinyllm/test_cuda_graph_cuda.py} \
      > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E " passed| failed|FAILED|Error" "$OUT/tests.txt" | tail -12
fi
if [ "${RULES_S:-0}" != 0 ]; then
  timeout "$RULES_S" python3 scripts/step_rules.py --preset tinyllama-1.1b --quant int8 ${SEARCH_1B:-${SEARCH_ARGS:-}} \
      > "$OUT/rules_1.1b.jsonl" 2> "$OUT/rules_1.1b.err"
  echo "1.1b rc=$?"; grep -v '"shape"' "$OUT/rules_1.1b.jsonl"
fi
if [ "${SMOL_S:-0}" != 0 ] && [ -n "${SMOL_GZ:-}" ]; then
  for r in ${SMOL_RUNS:-keep}; do
    IFS=: read -r q e <<< "$r"; f="$OUT/rules_smol_$q${e:+_${e//[^A-Za-z0-9]/_}}"
    env ${e:-} timeout "$SMOL_S" python3 scripts/step_rules.py --model /tmp/smol.gguf --quant "$q" ${SEARCH_SMOL:-${SEARCH_ARGS:-}} \
        > "$f.jsonl" 2> "$f.err"
    echo "smol $q ${e:-} rc=$?"; grep -v '"shape"' "$f.jsonl"
  done
fi
if [ "${BENCH_S:-0}" != 0 ]; then
  runs="tinyllama-1.1b:int8 tinyllama-1.1b:none"
  [ -n "${SMOL_GZ:-}" ] && runs="$runs /tmp/smol.gguf:keep /tmp/smol.gguf:none"
  for r in ${BENCH_RUNS:-$runs}; do
    IFS=: read -r m q e <<< "$r"; src="--preset $m"; [ -f "$m" ] && src="--model $m"
    f="$OUT/bench_$(basename "$m" .gguf)_$q${e:+_${e//[^A-Za-z0-9]/_}}"
    env ${e:-} timeout "$BENCH_S" python3 -m tinyllm.tools.cli bench $src --device cuda --quant "$q" --compile on --peers off --steps 128 \
        --repeats 3 --prompt-lens 128 --no-buckets > "$f.jsonl" 2> "$f.err"
    echo "$m $q ${e:-} rc=$? $(grep '"decode_tok_s"' "$f.jsonl" | sed 's/.*"value": \([0-9.]*\).*"impl": "\([a-z_]*\)".*/\2 \1/' | tr '\n' ' ')"
  done
fi
