"""Find the first module whose output differs between a graph replay and the same static
step run eagerly (a diagnostic for the bit-identity contract). Usage: python scripts/diag_graph_exact.py B"""

import sys

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.model import ModelConfig, Transformer

B = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.manual_seed(0)
cfg = ModelConfig.from_name("tiny", vocab_size=1024, dim=128, n_layers=4, n_heads=4, n_kv_heads=2,
                            ffn_dim=344, max_seq_len=1024)
model = Transformer(cfg).init_weights(0).to("cuda", torch.bfloat16).eval()
outs: list[tuple[str, torch.Tensor]] = []


def hook(name):
    def f(mod, args, out):
        outs.append((name, out if isinstance(out, torch.Tensor) else out[0]))
    return f


for name, mod in model.named_modules():
    if name:
        mod.register_forward_hook(hook(name))
prompt = torch.randint(0, 1024, (B, 100), device="cuda")
tok = torch.randint(0, 1024, (B, 1), device="cuda")
res = {}
for use_graph in (False, "eager-again", True):
    dec = GraphDecoder(model, B, max_len=1024, use_graph=use_graph is True)
    dec.prefill(prompt)
    outs.clear()
    if use_graph is True:
        dec.capture((128,))  # hooks run in the warm-up and in the capture: keep the capture's
        del outs[: len(outs) // 2]
    dec.step(tok)  # a replay runs no hooks, but refills the captured output tensors
    torch.cuda.synchronize()
    res[use_graph] = [(n, t.clone()) for n, t in outs]
    print("recorded", len(outs), "outputs with graphs" if use_graph else "eager")
for other in ("eager-again", True):
    for (n, a), (_, b) in zip(res[False], res[other], strict=True):
        if not torch.equal(a, b):
            print(f"B={B} eager vs {other}: first difference at {n}: "
                  f"max abs {(a.float() - b.float()).abs().max().item():.3g}")
            break
    else:
        print(f"B={B} eager vs {other}: every module output identical")
