"""The repetition stop's detector and DRY's breakers (tinyllm.decode.loops)."""

import random

from tinyllm.decode.loops import MIN_SPAN, RepeatWatch, breaker_ids, repeat_end


def by_hand(ids, checked, repeats, max_period=256):
    """The rule, one end and one period at a time."""
    for e in range(checked + 1, len(ids) + 1):
        for p in range(1, max_period + 1):
            span = max((repeats - 1) * p, MIN_SPAN)
            if span + p > e:
                continue
            bad = sum(ids[i] != ids[i - p] for i in range(e - span, e))
            if bad <= (span // 8 if p >= 8 else 0):
                return e
    return None


def test_a_counting_loop_stops_after_three_rounds():
    """ "13. The Bluefin Zombie\\n", "14. ...": one id differs a round; the stop comes in the
    third round, not before."""
    intro = list(range(100, 140))
    rounds = [[1000 + n, 5, 6, 7, 8, 9, 10, 11, 12, 13] for n in range(13, 30)]  # period 10
    ids = intro + [t for r in rounds for t in r]
    e = repeat_end(ids, 0, 3)
    assert e is not None and len(intro) + 2 * 10 < e <= len(intro) + 3 * 10 + MIN_SPAN
    assert repeat_end(ids[:e - 1], 0, 3) is None
    assert repeat_end(ids, 0, 0) is None  # off


def test_prose_and_lists_do_not_stop():
    rng = random.Random(3)
    prose = [rng.randrange(2000) for _ in range(600)]
    assert repeat_end(prose, 0, 3) is None
    items = [t for n in range(20) for t in (1000 + n, 5, 6, rng.randrange(2000), rng.randrange(2000), 9)]
    assert repeat_end(items, 0, 3) is None  # a list of like items, each its own


def test_equals_the_rule_by_hand_and_checks_only_new_ends():
    rng = random.Random(5)
    for trial in range(40):
        period = rng.choice([1, 2, 3, 7, 8, 12, 40])
        unit = [rng.randrange(6) for _ in range(period)]
        ids = [rng.randrange(6) for _ in range(rng.randrange(0, 60))] + unit * rng.randrange(1, 8)
        ids = [t if rng.random() > 0.05 else 99 for t in ids]
        checked = rng.randrange(0, len(ids) + 1)
        for repeats in (2, 3, 4):
            assert repeat_end(ids, checked, repeats) == by_hand(ids, checked, repeats), (trial, repeats)


def test_the_watch_finds_what_repeat_end_finds_pushed_in_any_chunks():
    """RepeatWatch, ids pushed in chunks of 1 to 20 (as a reply's runs come), stops at the end
    repeat_end finds over the whole reply, and, with periods long and slack, at none before it."""
    rng = random.Random(7)
    for trial in range(60):
        period = rng.choice([1, 2, 3, 7, 8, 12, 40, 130, 256])
        unit = [rng.randrange(6) for _ in range(period)]
        ids = [rng.randrange(6) for _ in range(rng.randrange(0, 80))] + unit * rng.randrange(1, 6)
        ids = [t if rng.random() > 0.04 else 99 for t in ids]
        for repeats in (0, 2, 3, 4):
            want = repeat_end(ids, 0, repeats)
            watch, got, at = RepeatWatch(repeats), None, 0
            while at < len(ids) and got is None:
                step = rng.randrange(1, 21)
                got, at = watch.push(ids[at:at + step]), at + step
            assert got == want, (trial, period, repeats, got, want)


class Letters:
    vocab_size = 6

    def decode(self, ids):
        return ["a", "b\n", ": ", '"', "**", "c"][ids[0]]


def test_breakers_are_the_ids_whose_text_holds_one():
    assert breaker_ids(Letters()) == [1, 2, 3, 4]
