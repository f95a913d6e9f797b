"""python scripts/quant_match.py QUANT...: greedy replies of the default model (64 tokens, the
app's repeat penalty), each QUANT against fp32, on the eval's first 40 single-turn prompts
(issue 11). Prints one JSON line per QUANT: replies identical, and the median length of the
common prefix in characters. STEP=native runs every reply (fp32's too) on the native CPU step
(tinyllm.decode.cpu_step), as the app does; TINYLLM_CPU_EXACT_X=0 rounds x to int8 blocks in the int8
products (as llama.cpp does) instead of taking it as it is."""

import json
import os
import sys

import torch

from tinyllm.formats.open_model import open_any
from tinyllm.session.chat import ChatSession

# The step the replies run: STEP=native (what the app runs on a CPU), else the plain eager step.
COMPILE = "native" if os.environ.get("STEP") == "native" else None


def single_turn_prompts(n: int = 40) -> list[str]:
    prompts = []
    with open("tinyllm/tools/eval/prompts.jsonl") as f:
        for line in f:
            r = json.loads(line)
            turns = r.get("turns") or [r.get("prompt")]
            if len(turns) == 1 and isinstance(turns[0], str):
                prompts.append(turns[0])
    return prompts[:n]


def replies(quant: str, prompts: list[str]) -> list[str]:
    model, tok, tmpl, name = open_any("models/tinychat", "cpu", torch.float32, quant=quant)
    out = []
    for p in prompts:
        s = ChatSession(model, tok, tmpl, max_len=512, name=name, compile=COMPILE)
        s.set_param("max_tokens", "64")
        out.append(list(s.send(p))[-1].text)
    return out


def common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    torch.set_num_threads(2)
    prompts = single_turn_prompts()
    ref = replies("none", prompts)
    for q in sys.argv[1:]:
        got = replies(q, prompts)
        pairs = list(zip(ref, got, strict=True))
        prefix = sorted(common_prefix(a, b) for a, b in pairs)
        print(json.dumps({"quant": q, "prompts": len(prompts), "identical": sum(a == b for a, b in pairs),
                          "median_common_prefix_chars": prefix[len(prefix) // 2]}))


if __name__ == "__main__":
    main()
