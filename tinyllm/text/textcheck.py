"""Cheap checks on generated text, shared by the data generator's filters and the eval's judge.

Contract: plain functions of strings, stdlib only, deterministic, no model.
- `normalize(text)`: lower case, punctuation dropped, whitespace collapsed (the form every
  comparison, hash and shingle uses).
- `words(text)`: the normalized words.
- `max_ngram_repeats(text, n)`: how often the most frequent word n-gram occurs; `has_loop`
  says a reply loops when some 4-gram occurs 3 times or more, or a sentence of 5+ words
  comes back (the eval's "degenerate", the generator's loop filter).
- `english_score(text)` / `is_english(text)`: share of ASCII among letters and of common
  English function words among words, outside fenced code.
- `sentences`, `list_items`, `numbers`: what format checks count (sentence enders, "- "/
  "1." lines, numerals and number words up to the thousands).
"""

from __future__ import annotations

import re
from collections import Counter

_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")
_FENCE = re.compile(r"```.*?(```|$)", re.S)


def normalize(text: str) -> str:
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.lower())).strip()


def words(text: str) -> list[str]:
    return normalize(text).split()


def max_ngram_repeats(text: str, n: int = 4) -> int:
    w = words(text)
    grams = Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return max(grams.values(), default=0)


def repeated_sentence(text: str, min_words: int = 5) -> bool:
    seen: set[str] = set()
    for s in re.split(r"(?<=[.!?])\s+|\n+", text):
        key = normalize(s)
        if len(key.split()) < min_words:
            continue
        if key in seen:
            return True
        seen.add(key)
    return False


def has_loop(text: str, n: int = 4, times: int = 3) -> bool:
    """A 4-gram said 3 times, or a sentence said twice: the signature of a looping reply."""
    return max_ngram_repeats(text, n) >= times or repeated_sentence(text)


# The commonest English function words: a reply in English uses them, almost any other does not.
_FUNCTION_WORDS = frozenset("""
a about after all also an and any are as at be because been but by can could do does for from
had has have he her his how i if in into is it its just like me more most my no not of on one
only or other our out so some than that the their them then there these they this to up us
very was we were what when where which while who will with would you your
""".split())


def english_score(text: str) -> tuple[float, float]:
    """(share of ASCII among letters, share of function words among words), fenced code excluded."""
    prose = _FENCE.sub(" ", text)
    letters = [c for c in prose if c.isalpha()]
    ascii_share = sum(c.isascii() for c in letters) / len(letters) if letters else 1.0
    w = words(prose)
    func_share = sum(x in _FUNCTION_WORDS for x in w) / len(w) if w else 0.0
    return ascii_share, func_share


def is_english(text: str, min_ascii: float = 0.97, min_function: float = 0.12, short: int = 8) -> bool:
    """Mostly ASCII letters and, for texts of `short` words or more, enough function words."""
    ascii_share, func_share = english_score(text)
    if ascii_share < min_ascii:
        return False
    return len(words(_FENCE.sub(" ", text))) < short or func_share >= min_function


def sentences(text: str) -> int:
    """Sentences in a reply: runs ended by . ! ? (or the end), decimals and list numbers
    ("3.5", "1.") not counted as ends; blank and marker-only pieces skipped."""
    t = re.sub(r"(\d)\.(\d)", r"\1,\2", text.strip())
    t = re.sub(r"(?m)^\s*\d+[.)]\s+", "", t)
    t = re.sub(r"\b(e\.g|i\.e|etc|Mr|Mrs|Dr|St|vs)\.", r"\1", t)
    parts = [p for p in re.split(r"[.!?]+(?:[\"')\]]*)(?:\s+|$)|\n+", t) if re.search(r"\w", p)]
    return len(parts)


_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S")


def list_items(text: str) -> int:
    return sum(bool(_ITEM.match(line)) for line in text.splitlines())


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}
_NUM = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _word_numbers(text: str) -> list[tuple[int, float]]:
    """(position, value) of number words: "seven", "forty-two", "three hundred", "two thousand"."""
    out: list[tuple[int, float]] = []
    toks = list(re.finditer(r"[a-z]+", text.lower()))
    i = 0
    while i < len(toks):
        w = toks[i].group()
        if w not in _UNITS and w not in _TENS:
            i += 1
            continue
        start, value, j = toks[i].start(), 0, i
        while j < len(toks):
            w = toks[j].group()
            if j > i and text[toks[j - 1].end():toks[j].start()].strip(" -"):
                break  # number words join only across spaces and hyphens
            if w in _UNITS:
                value += _UNITS[w]
            elif w in _TENS:
                value += _TENS[w]
            elif w == "hundred" and value:
                value *= 100
            elif w == "thousand" and value:
                value *= 1000
            elif w != "and" or j == i:
                break
            j += 1
        out.append((start, float(value)))
        i = max(j, i + 1)
    return out


def numbers(text: str) -> list[float]:
    """Every number in the text in order of appearance: numerals ("1,200", "3.5"; no signs) and
    number words ("forty-two")."""
    found = [(m.start(), float(m.group().rstrip(",").replace(",", ""))) for m in _NUM.finditer(text)]
    return [v for _, v in sorted(found + _word_numbers(text))]


# ---- one checker for the eval's answers and the generator's system-prompt constraints ----------

CHECKS = ("any", "all", "none", "number", "yes", "sentences", "max_sentences", "max_words", "items",
          "min_items", "starts_with", "starts_with_any", "ends_with")


def _has(text: str, phrase: str) -> bool:
    return f" {normalize(phrase)} " in f" {normalize(text)} "


def _first_word(text: str) -> str:
    w = words(text)
    return w[0] if w else ""


def first_new_number(reply: str, prompt: str = "") -> float | None:
    """The first number in the reply that the prompt does not hold (the reply's answer):
    the first such numeral, else the first such number word."""
    given = set(numbers(prompt))
    numerals = [float(m.group().rstrip(",").replace(",", "")) for m in _NUM.finditer(reply)]
    for found in (numerals, numbers(reply)):  # numerals first: "one" is often not a number
        new = [x for x in found if x not in given]
        if new:
            return new[0]
    return None


def check_reply(reply: str, spec: dict, prompt: str | list[str] = "") -> bool:
    """True when the reply meets every key of spec and does not just say the question back.
    prompt: the question, or the chat's turns so far (the last one the question; numbers in
    any of them count as given):
      any / all / none: lists of words or phrases, matched whole and case-insensitively
      number: the first number in the reply that is not in the prompt equals it (or, with none
              new, it is there); numerals or number words
      yes: true / false: the reply's first word is "yes" / "no"
      sentences / max_sentences: exactly / at most so many sentences
      max_words, items (exactly n list lines), min_items, starts_with (first word),
      starts_with_any (a list of first words), ends_with (the stripped reply's last characters)
    """
    unknown = set(spec) - set(CHECKS)
    assert not unknown, f"unknown check keys {sorted(unknown)}"
    text = reply.strip()
    turns = [prompt] if isinstance(prompt, str) else list(prompt)
    if turns and turns[-1] and normalize(text) == normalize(turns[-1]):
        return False  # repeating the question answers nothing
    prompt = "\n".join(turns)
    ok = True
    if "any" in spec:
        ok &= any(_has(text, p) for p in spec["any"])
    if "all" in spec:
        ok &= all(_has(text, p) for p in spec["all"])
    if "none" in spec:
        ok &= not any(_has(text, p) for p in spec["none"])
    if "number" in spec:
        want = float(spec["number"])
        got = first_new_number(text, prompt)
        ok &= got == want if got is not None else want in numbers(text)
    if "yes" in spec:
        ok &= _first_word(text) == ("yes" if spec["yes"] else "no")
    if "sentences" in spec:
        ok &= sentences(text) == spec["sentences"]
    if "max_sentences" in spec:
        ok &= 1 <= sentences(text) <= spec["max_sentences"]
    if "max_words" in spec:
        ok &= len(words(text)) <= spec["max_words"]
    if "items" in spec:
        ok &= list_items(text) == spec["items"]
    if "min_items" in spec:
        ok &= list_items(text) >= spec["min_items"]
    if "starts_with" in spec:
        ok &= _first_word(text) == spec["starts_with"].lower()
    if "starts_with_any" in spec:
        ok &= _first_word(text) in {w.lower() for w in spec["starts_with_any"]}
    if "ends_with" in spec:
        ok &= text.endswith(spec["ends_with"])
    return bool(ok)
