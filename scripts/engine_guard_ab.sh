#!/usr/bin/env bash
# Issue 35's CPU guard on several trees, alternated in one run: the compiled engine (16 slots, a 2-layer
# dim-192 model, 16 requests of 20-35 prompt tokens and 48 new tokens) at max_len 256 and 4096, three runs
# each (the first compiles). Usage: bash scripts/engine_guard_ab.sh [ROUNDS] COMMIT... ("." is this tree).
#   bash scripts/engine_guard_ab.sh 2 bd50178^ 28a3f5c .
set -u
cd "$(dirname "$0")/.."
rounds=$1; shift
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for c in "$@"; do
  [ "$c" = . ] && continue
  mkdir -p "$work/$c" && git archive "$c" tinyllm | tar -x -C "$work/$c"
done
cat > "$work/guard.py" <<'PY'
import os, time, torch
# Chosen by the tree's layout, not by trying: the venv's editable install would find the new
# layout's modules for an old tree and mix the two.
if os.path.isdir(os.path.join(os.environ["TREE"], "tinyllm", "core")):
    from tinyllm.model import ModelConfig, Transformer
    from tinyllm.decode.engine import Engine
    from tinyllm.decode.sampling import SamplingParams
else:  # the layout before the layer folders
    from tinyllm.model import ModelConfig, Transformer
    from tinyllm.engine import Engine
    from tinyllm.sampling import SamplingParams
import tinyllm
assert os.path.dirname(tinyllm.__file__) == os.path.join(os.environ["TREE"], "tinyllm"), tinyllm.__file__
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=512, dim=192, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=512, max_seq_len=4096)
model = Transformer(cfg).init_weights(0).eval()
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(0, 512, (int(torch.randint(20, 36, (1,), generator=g)),), generator=g).tolist() for _ in range(16)]
for M in (256, 4096):
    eng = Engine(model, 16, max_len=M, compile="inductor")
    for rep in range(3):
        for p in prompts:
            eng.add_request(p, SamplingParams(max_tokens=48))
        t = time.perf_counter(); eng.run_until_done(); s = time.perf_counter() - t
        print(f"max_len {M} run {rep}: {16 * 48 / s:.0f} tok/s", flush=True)
PY
for r in $(seq "$rounds"); do
  for c in "$@"; do
    dir=$PWD; [ "$c" = . ] || dir=$work/$c
    echo "== $c, round $r"
    (cd "$dir" && TREE=$dir PYTHONPATH=$dir timeout 900 "$OLDPWD/$py" "$work/guard.py" 2>&1 | grep "tok/s\|Error")
  done
done
