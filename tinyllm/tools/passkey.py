"""The pass-key check of a long context: a key hidden in about 6,000 tokens of filler, found.

Contract: `passkey_ids(tok, key, at, n_fill)` -> token ids of a raw text (not a chat turn): an
instruction, `n_fill` repeats of a filler sentence with one "The pass key is KEY ..." sentence
after the first `at` share of them, ending "The pass key is". Every piece starts with a spaced
word, so the pieces' ids are simply concatenated (the filler is tokenized once).
`find_keys(dec, tok, keys, n_fill, steps)` runs one decoder over the three texts of
`keys` {key: at}, at ascending, sharing prefixes: it prefills up to the first key's place once,
then for each key appends the key and the rest, decodes `steps` greedy tokens with the decoder's
step (native on a CPU, graphs on CUDA: whatever `dec` runs), and rewinds (`truncate`) to go on
to the next key's place. Returns {key: the decoded text}. The decoder's max_len must hold the
text plus `steps`.

Why a raw text: asked in a chat, the 135M SmolLM2 misses the key in transformers too; as a
continuation, transformers finds all three (scripts/passkey_transformers.py).
"""

from __future__ import annotations

import torch

INTRO = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it."
FILL = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def _key(key: int) -> str:
    return f" The pass key is {key}. Remember it. {key} is the pass key."


def passkey_ids(tok, key: int, at: float, n_fill: int) -> list[int]:
    """The whole text's ids, for a reference run (transformers)."""
    k = int(at * n_fill)
    fill = tok.encode(FILL)
    return _intro(tok) + fill * k + tok.encode(_key(key)) + fill * (n_fill - k) + tok.encode(" The pass key is")


def _intro(tok) -> list[int]:
    bos = [tok.bos_id] if tok.bos_id is not None and tok.bos_id >= 0 else []
    return bos + tok.encode(INTRO)


@torch.no_grad()
def find_keys(dec, tok, keys: dict[int, float], n_fill: int, steps: int = 8) -> dict[int, str]:
    fill, tail = tok.encode(FILL), tok.encode(" The pass key is")
    out: dict[int, str] = {}
    done = 0  # fill sentences in the cache after the intro
    dec.prefill(torch.tensor([_intro(tok)]))
    for key, at in sorted(keys.items(), key=lambda kv: kv[1]):
        k = int(at * n_fill)
        if k > done:
            dec.append(torch.tensor([fill * (k - done)]))  # the shared prefix, up to this key's place
            done = k
        mark = dec.n
        logits = dec.append(torch.tensor([tok.encode(_key(key)) + fill * (n_fill - k) + tail]))
        ids = [int(logits[0, -1].argmax())]
        dec.tok.fill_(ids[0])
        for _ in range(steps - 1):
            dec.run(1)
            ids.append(int(dec.tok))
        out[key] = tok.decode(ids)
        dec.truncate(mark)
    return out
