"""Write the default model (models/tinychat, real weights) as GGUF files of every matrix in
Q8_0 and in Q4_1: data/tinychat.Q8_0.gguf, data/tinychat.Q4_1.gguf (llama.cpp reads them;
scripts/cpu_side_by_side.sh). Uses the tests' writer (tests/tinyllm/test_gguf.py: the gguf
package). Run from the repository root: python scripts/tinychat_gguf.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.tinyllm.test_gguf import Q, sp_kv, write_gguf  # noqa: E402
from tinyllm.formats.checkpoint import load_checkpoint  # noqa: E402

ck = load_checkpoint("models/tinychat", quant="none")
Path("data").mkdir(exist_ok=True)
for name, qtype in (("Q8_0", Q.Q8_0), ("Q4_1", Q.Q4_1)):
    types = {k: qtype for k, t in ck.model.state_dict().items() if t.dim() == 2}
    write_gguf(f"data/tinychat.{name}.gguf", ck.model, types, sp_kv(ck.tokenizer, "chatml"))
    print(f"wrote data/tinychat.{name}.gguf")
