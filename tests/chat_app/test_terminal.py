"""PasteGuard and the parser behind it (chat_app.terminal), fed the way the input thread feeds
them: pieces split at every boundary, `idle()` when the select times out, `tick()` after each
read. The parser's clock is a fake one, so no test waits on ESCDELAY."""

from __future__ import annotations

from itertools import combinations

import pytest

from chat_app.terminal import PASTE_END, PASTE_START, VISIBLE_ESC, PasteGuard, driver_class

E = VISIBLE_ESC
EMBEDDED = f"{PASTE_START}abc{PASTE_END}INJECT\r more{PASTE_END}"  # tmux, when the text holds an end marker


def pieces(raw: str, cuts: int):
    """Every way to cut raw into cuts + 1 pieces (empty pieces too)."""
    for at in combinations(range(len(raw) + 1), cuts):
        bounds = (0, *sorted(at), len(raw))
        yield [raw[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def through(guard: PasteGuard, parts: list[str]) -> str:
    return "".join(guard.feed(p) for p in parts) + guard.idle()


@pytest.mark.parametrize("keys", ["\x1b", "a\x1b", "\x1b[A", "\x1bx", "\x1b[20", "\x1b[200", "\x1b\x1b[201~"])
def test_outside_a_paste_nothing_is_held_back(keys):
    for parts in pieces(keys + "zz", 2):
        guard = PasteGuard()
        assert [guard.feed(p) for p in parts] == parts  # every piece passed on at once, unchanged


def test_escapes_inside_a_paste_are_text_at_every_split():
    raw = f"x{PASTE_START}a\x1b[Ab\x11\r\x1b{PASTE_END}y"
    want = f"x{PASTE_START}a{E}[Ab\x11\r{E}{PASTE_END}y"
    for parts in pieces(raw, 2):
        assert through(PasteGuard(), parts) == want, parts


def test_what_follows_an_end_marker_waits_for_idle():
    guard = PasteGuard()
    assert guard.feed(f"{PASTE_START}abc{PASTE_END}\r") == f"{PASTE_START}abc"
    assert guard.idle() == f"{PASTE_END}\r"  # the input went quiet: that was the real end
    assert guard.feed("\x1b") == "\x1b" and guard.idle() == ""


def test_an_embedded_end_marker_is_text_at_every_split():
    want = f"{PASTE_START}abc{E}[201~INJECT\r more{PASTE_END}"
    for parts in pieces(EMBEDDED, 3):
        assert through(PasteGuard(), parts) == want, parts


def test_text_then_a_start_marker_in_one_burst_is_text():
    raw = f"{PASTE_START}a{PASTE_END}X\r{PASTE_START}b{PASTE_END}"
    for parts in pieces(raw, 2):
        assert through(PasteGuard(), parts) == f"{PASTE_START}a{E}[201~X\r{E}[200~b{PASTE_END}", parts


def test_two_pastes_back_to_back_stay_two():
    raw = f"{PASTE_START}a{PASTE_END}{PASTE_START}b{PASTE_END}"
    for parts in pieces(raw, 2):
        assert through(PasteGuard(), parts) == raw, parts


# ---- the guard in front of Textual's parser ----------------------------------------------

@pytest.fixture
def parser(monkeypatch):
    """SafeLinuxDriver's parser on a fake clock: `parser.clock[0] += 1` lets ESCDELAY pass."""
    import textual._parser

    cls = driver_class()
    if cls is None:
        pytest.skip("Textual's own driver on this platform")
    clock = [0.0]
    monkeypatch.setattr(textual._parser, "get_time", lambda: clock[0])
    p = cls.parser_class()
    p.clock = clock
    return p


def events(parser, *reads: str, idle: bool = True) -> list:
    """What the input thread makes of these reads: feed and tick each, then idle, time passes."""
    got = []
    for data in reads:
        got += list(parser.feed(data)) + list(parser.tick())
    if idle:
        parser.clock[0] += 1
        got += list(parser.idle()) + list(parser.tick())
    return got


def keys(got) -> list[str]:
    return [getattr(e, "key", None) or f"{type(e).__name__}({e.text!r})" for e in got]


def test_a_lone_escape_is_the_escape_key_and_the_parser_lives_on(parser):
    assert events(parser, "\x1b", idle=False) == []  # ESCDELAY has not passed
    assert keys(events(parser)) == ["escape"]
    assert keys(events(parser, "a")) == ["a"]  # was: ParseError, end of file reached
    assert keys(events(parser, "\x1b", "x")) == ["alt+x"]  # ESC and a key in one burst: Alt
    assert keys(events(parser, "\x1b[A\x1b[1;3D")) == ["up", "alt+left"]


def test_escape_then_a_typed_start_marker_is_not_a_paste(parser):
    assert keys(events(parser, "\x1b")) == ["escape"]
    events(parser, "[200~")  # typed after the parser gave up on the ESC: keys, not a marker
    assert keys(events(parser, "\x1b[A")) == ["up"]  # not made visible as paste text


def test_an_embedded_end_marker_sends_nothing(parser):
    got = events(parser, *EMBEDDED.partition("INJECT"))
    assert keys(got) == [f"Paste({f'abc{E}[201~INJECT' + chr(13) + ' more'!r})"]
    assert keys(events(parser, "z")) == ["z"]


def test_keys_after_a_paste_arrive_after_idle(parser):
    assert events(parser, f"{PASTE_START}ab{PASTE_END}z", idle=False) == []
    assert keys(events(parser)) == ["Paste('ab')", "z"]
