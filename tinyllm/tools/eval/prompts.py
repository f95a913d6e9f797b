"""The eval's prompts: prompts.jsonl beside this file, written for this project and kept out of
every training set (tinyllm.tools.datagen's LeakFilter; tests/tinyllm/test_eval.py).

Contract: `load_prompts(path=None) -> list[dict]`, each {"id", "cat", "messages", "check"?}:
a line's "prompt" (+ optional "system") becomes messages [system?, user]; a line with
"messages" (a multi-turn chat whose earlier assistant turns are fixed) ends with a user turn.
"check" is a `tinyllm.text.textcheck.check_reply` spec; a prompt without one is open (it counts in
the degenerate rate only). Ids are unique; a malformed line is a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tinyllm.text.textcheck import CHECKS

PROMPTS = Path(__file__).with_name("prompts.jsonl")


def load_prompts(path: str | Path | None = None) -> list[dict]:
    path = Path(path or PROMPTS)
    out: list[dict] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        p = json.loads(line)
        if "messages" not in p:
            p["messages"] = ([{"role": "system", "content": p.pop("system")}] if "system" in p else []) + [
                {"role": "user", "content": p.pop("prompt")}]
        msgs, check = p["messages"], p.get("check")
        if not msgs or msgs[-1]["role"] != "user" or any(m["role"] not in ("system", "user", "assistant") for m in msgs):
            raise ValueError(f"{path}:{n} ({p.get('id')}): messages must end with a user turn")
        if check is not None and (not check or set(check) - set(CHECKS)):
            raise ValueError(f"{path}:{n} ({p.get('id')}): check keys must be among {CHECKS}")
        out.append(p)
    ids = [p["id"] for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate prompt ids")
    return out


def user_turns(prompts: list[dict] | None = None) -> list[str]:
    """Every user turn of the eval's prompts: what training data must never hold."""
    return [m["content"] for p in (prompts or load_prompts()) for m in p["messages"] if m["role"] == "user"]
