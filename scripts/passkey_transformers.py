"""transformers' own answer to tinyllm.tools.passkey's texts: SmolLM2's GGUF (dequantized by
transformers' GGUF reader, fp32), the same ids, greedy, 8 tokens. tests/tinyllm/test_passkey.py
says tinyllm finds what this finds.

Usage: python scripts/passkey_transformers.py [GGUF]   (default: data/smollm2/*.gguf)
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tinyllm.formats.open_model import open_any  # noqa: E402
from tinyllm.tools.passkey import FILL, passkey_ids  # noqa: E402

gguf = Path(sys.argv[1] if len(sys.argv) > 1 else sorted(Path("data/smollm2").glob("*.gguf"))[0])
_, tok, _, _ = open_any(gguf, "cpu", quant="none")
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
n_fill = 6000 // len(tok.encode(FILL))
for key, at in {68215: 0.2, 40973: 0.5, 81526: 0.8}.items():
    ids = torch.tensor([passkey_ids(tok, key, at, n_fill)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:].tolist())
    print(f"{len(ids[0])} tokens, key {key} at {at:.0%}: {text!r} {'found' if str(key) in text else 'MISSED'}")
