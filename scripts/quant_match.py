"""python scripts/quant_match.py QUANT...: greedy replies of the default model (64 tokens, the app's repeat
penalty), each QUANT against fp32, on the eval's first 40 single-turn prompts (issue 11)."""
import json, sys, torch
from tinyllm.chat import ChatSession
from tinyllm.open_model import open_any
torch.set_num_threads(2)
prompts = []
for line in open("tinyllm/eval/prompts.jsonl"):
    r = json.loads(line)
    turns = r.get("turns") or [r.get("prompt")]
    if isinstance(turns, list) and len(turns) == 1 and isinstance(turns[0], str):
        prompts.append(turns[0])
prompts = prompts[:40]
def replies(quant):
    model, tok, tmpl, name = open_any("models/tinychat", "cpu", torch.float32, quant=quant)
    out = []
    for p in prompts:
        s = ChatSession(model, tok, tmpl, max_len=512, name=name, compile=None)
        s.set_param("max_tokens", "64")
        out.append(list(s.send(p))[-1].text)
    return out
ref = replies("none")
for q in sys.argv[1:]:
    got = replies(q)
    same = sum(a == b for a, b in zip(ref, got))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(ref, got)]
    print(json.dumps({"quant": q, "prompts": len(prompts), "identical": same, "median_common_prefix_chars": sorted(prefix)[len(prefix)//2]}))
