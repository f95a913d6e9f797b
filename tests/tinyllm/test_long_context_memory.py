"""Memory follows the conversation on a CPU: a model with a 131,072-position context opens with
all of it (tinyllm.session.context) and "hi" raises the process's RSS by the weights and a small
margin, not by the 512 MB that the whole cache would hold (tinyllm.kv_cache maps its storage and
commits only the pages written). Measured in a fresh process, so nothing else moves its RSS."""

import json
import subprocess
import sys

import pytest

from tinyllm.tools.testing import make_tiny_checkpoint

CONTEXT = 131072
SHAPE = dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=4)  # 64-dim heads: 4 KB of bf16 K/V a position
CHILD = """
import json, resource, sys, torch
from tinyllm.session.chat import open_session

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

base = rss()
s = open_session(sys.argv[1], "cpu", compile="auto")
s.set_param("max_tokens", "8")
opened = rss()
events = list(s.send("hi"))
weights = sum(t.numel() * t.element_size() for t in s.model.state_dict().values())
print(json.dumps(dict(base=base, opened=opened, after=rss(), weights=weights, max_len=s.max_len,
                      step=s.step_kind, cache=s.decoder.cache.nbytes(), reason=events[-1].reason)))
"""


@pytest.fixture(scope="module")
def long_ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ctx128k") / "tiny", max_seq_len=CONTEXT, **SHAPE)


def test_a_128k_context_costs_only_what_is_written(long_ckpt):
    out = subprocess.run([sys.executable, "-c", CHILD, str(long_ckpt)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["max_len"] == CONTEXT and r["reason"] in ("eos", "max_tokens")
    assert r["cache"] >= 512 * 2**20  # what the whole cache holds, allocated (mapped) ...
    grown = r["after"] - r["base"]
    assert grown < r["weights"] + 128 * 2**20, r  # ... but not paid for: about the weights and torch's own
