"""Exact and near duplicates (MinHash over word shingles) and leaks into held-out prompts.

Contract (stdlib only, deterministic: hashes are blake2b, never Python's salted hash()):
- `shingles(text, k=3)`: the set of 64-bit hashes of the normalized text's word k-grams (a
  text shorter than k words is one shingle of all its words).
- `NearDup(threshold=0.7)`: `add(text) -> bool` is True when the text is new, False when its
  normalized form was seen (exact) or a kept text's estimated Jaccard similarity on shingles
  is >= threshold (near); a new text is remembered. MinHash of NUM_PERM permutations,
  banded BANDS x ROWS for candidates, each candidate confirmed on the signatures' agreement.
- `LeakFilter(prompts)`: `leaks(text) -> str | None` names the held-out prompt a text leaks:
  its normalized form equals a prompt's, or the text holds >= `containment` of the shingles
  of a prompt of 3+ shingles (so a longer text that quotes a prompt leaks it too; a short
  generic prompt such as "tell me a joke" leaks only when said exactly). Used on every user turn the generator
  writes, and by the test that the eval prompts never appear in training data.
"""

from __future__ import annotations

import hashlib
import struct
from collections import defaultdict
from collections.abc import Iterable

from tinyllm.text.textcheck import normalize

NUM_PERM, BANDS, ROWS = 32, 8, 4  # 8 bands of 4: pairs above ~0.6 Jaccard meet in some band
_P = (1 << 61) - 1
_M64 = (1 << 64) - 1


def _h64(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "little")


def shingles(text: str, k: int = 3) -> set[int]:
    w = normalize(text).split()
    if len(w) < k:
        return {_h64(" ".join(w))} if w else set()
    return {_h64(" ".join(w[i:i + k])) for i in range(len(w) - k + 1)}


def _perms(seed: int = 0) -> list[tuple[int, int]]:
    out = []
    for i in range(NUM_PERM):
        d = hashlib.blake2b(f"minhash:{seed}:{i}".encode(), digest_size=16).digest()
        a, b = struct.unpack("<QQ", d)
        out.append((a % (_P - 1) + 1, b % _P))
    return out


_PERMS = _perms()


def minhash(sh: set[int]) -> tuple[int, ...]:
    """NUM_PERM minimums of (a x + b) mod p over the shingles."""
    return tuple(min(((a * x + b) % _P) for x in sh) for a, b in _PERMS) if sh else (0,) * NUM_PERM


class NearDup:
    def __init__(self, threshold: float = 0.7):
        self.threshold = threshold
        self.exact: set[bytes] = set()
        self.bands: list[dict[tuple[int, ...], list[int]]] = [defaultdict(list) for _ in range(BANDS)]
        self.sigs: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return len(self.exact)

    def add(self, text: str) -> bool:
        """True (and remembered) when text is neither an exact nor a near duplicate."""
        key = hashlib.blake2b(normalize(text).encode(), digest_size=12).digest()
        if key in self.exact:
            return False
        sig = minhash(shingles(text))
        parts = [sig[b * ROWS:(b + 1) * ROWS] for b in range(BANDS)]
        seen: set[int] = set()
        for band, part in zip(self.bands, parts, strict=True):
            for j in band.get(part, ()):
                if j in seen:
                    continue
                seen.add(j)
                other = self.sigs[j]
                if sum(x == y for x, y in zip(sig, other, strict=True)) >= self.threshold * NUM_PERM:
                    return False
        self.exact.add(key)
        j = len(self.sigs)
        self.sigs.append(sig)
        for band, part in zip(self.bands, parts, strict=True):
            band[part].append(j)
        return True


class LeakFilter:
    def __init__(self, prompts: Iterable[str], containment: float = 0.9):
        self.containment = containment
        self.prompts: list[str] = []
        self.norms: list[str] = []
        self.sizes: list[int] = []
        self.index: dict[int, list[int]] = defaultdict(list)
        for p in dict.fromkeys(prompts):
            n = normalize(p)
            if not n:
                continue
            i = len(self.prompts)
            self.prompts.append(p)
            self.norms.append(n)
            sh = shingles(p)
            self.sizes.append(len(sh))
            for s in sh:
                self.index[s].append(i)
        self.exact = {n: i for i, n in enumerate(self.norms)}

    def __len__(self) -> int:
        return len(self.prompts)

    def leaks(self, text: str) -> str | None:
        """The held-out prompt this text leaks, or None."""
        n = normalize(text)
        if n in self.exact:
            return self.prompts[self.exact[n]]
        hits: dict[int, int] = defaultdict(int)
        for s in shingles(text):
            for i in self.index.get(s, ()):
                hits[i] += 1
        for i, k in sorted(hits.items()):
            if self.sizes[i] >= 3 and k >= self.containment * self.sizes[i]:
                return self.prompts[i]
        return None
