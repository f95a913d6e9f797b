"""The real tinyllm-chat in a pseudo-terminal: the bytes a terminal sends, the screen read back
through pyte (tests/chat_app/pty_terminal.py). Pilot never goes through the terminal's input
parser; these tests do, so they guard what Pilot cannot see (issue 31: a lone Esc killed the
app; a paste holding an end marker sent a message).

Few and fast: one app process serves the key tests, in file order; Ctrl+C/Ctrl+Q get their own.
No assert depends on timing: each waits on screen state, with a deadline that only stops a
hung test. The one pause (Esc alone) only keeps Esc and the next key in separate reads, as a
human types them; were they read together, the test would still pass, and test the Alt+key
path instead. The shared app holds its first reply after its first text until a stop
arrives (tests/chat_app/held_child.py, set through a three-line wrapper around
chat_app.__main__.main), so Esc mid-reply cannot find the reply already ended, on any CPU.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

if sys.platform == "win32":
    pytest.skip("no pseudo-terminals", allow_module_level=True)

from chat_app.labels import printable  # noqa: E402
from chat_app.store import Saved, Store  # noqa: E402
from chat_app.terminal import VISIBLE_ESC  # noqa: E402
from tests.chat_app.conftest import rows  # noqa: E402
from tests.chat_app.pty_terminal import Terminal  # noqa: E402
from tests.chat_app.test_labels import ESCAPES, named_checkpoint  # noqa: E402

ESC, F1, CTRL_O, CTRL_C, CTRL_Q, ALT_BACKSPACE = "\x1b", "\x1bOP", "\x0f", "\x03", "\x11", "\x1b\x7f"
CTRL_P, TAB = "\x10", "\t"
LEFT, HOME, END, DELETE, CTRL_LEFT = "\x1b[D", "\x1b[H", "\x1b[F", "\x1b[3~", "\x1b[1;5D"
BACKSPACE = "\x7f"
READY = "· ready ·"  # the status bar, once the model has loaded and no reply runs
YOU = "─ you ─"  # the border of a sent message
HELP = "tinyllm-chat help"  # F1's title
HELD = ("import chat_app.__main__ as m\nfrom tests.chat_app.held_child import held_in_child\n"
        "build = m.build_app\nm.build_app = lambda args: held_in_child(build(args))\nm.main()")


def start(ckpt, folder, *argv: str, held: bool = False) -> Terminal:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES") and not k.startswith("TEXTUAL")}
    env.update(TERM="xterm-256color", TINYLLM_CHAT_DATA_DIR=str(folder / "data"),
               TINYLLM_CHAT_CONFIG_DIR=str(folder / "config"))
    program = ["-c", HELD] if held else ["-m", "chat_app"]
    term = Terminal([sys.executable, *program, "--model", str(ckpt), "--device", "cpu", "--compile", "off", *argv],
                    env)
    try:
        term.wait(READY, "the model to load")
    except BaseException:
        term.close()
        raise
    return term


@pytest.fixture(scope="module")
def chat(ckpt, tmp_path_factory):
    term = start(ckpt, tmp_path_factory.mktemp("pty"), "--ignore-eos", held=True)
    yield term
    term.close()


def typed(term: Terminal, *lines: str) -> None:
    term.wait(lambda: term.input_text().split("\n") == list(lines), f"the input to hold {lines!r}")


def settled(term: Terminal) -> None:
    """Every key sent so far has been handled: F1 is the app's binding, run once its key has
    bubbled up to the app, after every key sent before it. (The input's own bindings, the
    arrows, Home, Backspace, act as they arrive, in order with letters.)"""
    term.send(F1)
    term.wait(HELP)
    term.send(ESC)
    term.wait(lambda: HELP not in term.text(), "the help to close")


def clear(term: Terminal) -> None:
    term.send(END + BACKSPACE * 80)
    settled(term)
    typed(term, "")


def test_escape_alone_then_a_key(chat):
    clear(chat)
    chat.send(ESC)
    time.sleep(0.5)  # a human's pause: the Esc is read alone (see the module's docstring)
    chat.send("a")
    typed(chat, "a")  # was: ParseError, end of file reached, and the app gone
    assert chat.exit_code(wait=False) is None


def test_escape_closes_help_and_the_chat_list(chat):
    clear(chat)
    for opens, shows in ((F1, HELP), (CTRL_O, "Esc closes")):
        chat.send(opens)
        chat.wait(shows)
        chat.send(ESC)
        chat.wait(lambda shows=shows: shows not in chat.text(), f"Esc to close {shows!r}")
    chat.send("b")
    typed(chat, "b")


def test_arrows_home_end_delete_and_alt_keys(chat):
    clear(chat)
    chat.send("one two three")
    typed(chat, "one two three")
    chat.send(CTRL_LEFT + BACKSPACE + HOME + DELETE + END + ALT_BACKSPACE + LEFT + BACKSPACE)
    typed(chat, "n")  # one two |three, one two|three, |one twothree, |ne twothree, ne twothree|, ne |, ne| , n|


def test_letters_and_bound_keys_in_one_burst_act_in_order(chat):
    """Before: a key bound on the input (an arrow, Home, Backspace) acted only once it had
    bubbled up to the app, after the letters sent behind it: "ab", Left, Left, "X" in one
    burst gave "abX". A terminal's key repeat, a macro or a fast typist sends such bursts."""
    clear(chat)
    chat.send("ab" + LEFT + LEFT + "X" + END + "c" + BACKSPACE + BACKSPACE + "!" + HOME + "<")
    typed(chat, "<Xa!")


@pytest.mark.parametrize("paste, lands", [
    ("hello\rworld", ["hello", "world"]),
    # tmux passes an end marker that the pasted text holds on: the rest is still text
    ("abc\x1b[201~INJECT\r more", [f"abc{VISIBLE_ESC}[201~INJECT", "more"]),
], ids=["plain", "embedded-end-marker"])
def test_a_bracketed_paste_is_text(chat, paste, lands):
    clear(chat)
    sent = chat.text().count(YOU)
    chat.send(f"\x1b[200~{paste}\x1b[201~")
    typed(chat, *lands)  # a replayed Enter would have sent (and taken) "abcINJECT"
    settled(chat)
    assert chat.text().count(YOU) == sent and READY in chat.text()


def test_invalid_utf8_is_survived(chat):
    clear(chat)
    chat.send(b"\xff\xfe")
    chat.send(b"ok\xe2\x82")  # and a character cut short
    chat.send("!")
    typed(chat, "\ufffd\ufffdok\ufffd!")


def test_ctrl_p_opens_the_palette_and_tab_completes_a_command(chat):
    """Issue 34, item 8: Ctrl+P (a priority key, over the input) opens Textual's palette with the
    commands; typing searches; Esc closes it. Tab in the input completes /th to "/theme "."""
    clear(chat)
    chat.wait(lambda: "^p Commands" in chat.lines()[-1], "the footer's right end")
    chat.send(CTRL_P)
    chat.wait("/set NAME VALUE", "the palette's commands")
    chat.send("nord")
    chat.wait("Theme: nord", "the theme found")
    chat.send(ESC)
    chat.wait(lambda: "Theme: nord" not in chat.text() and "/set NAME VALUE" not in chat.text(), "Esc to close it")
    chat.send("/th" + TAB)
    settled(chat)
    chat.send("nord")
    typed(chat, "/theme nord")  # the name, and the space after it
    clear(chat)


def test_resize_redraws_at_the_new_size(chat):
    for cols, height in ((120, 40), (100, 30)):
        chat.resize(cols, height)
        chat.wait(lambda h=height: READY in chat.lines()[h - 2] and chat.lines()[h - 3].endswith("▁▎"),
                  f"a redraw at {cols}x{height}")


def test_escape_mid_reply_stops_it(chat):
    clear(chat)
    chat.send("hi\r")
    chat.wait("· generating ·")  # held after its first text: it cannot end before the stop
    chat.send(ESC)
    took = chat.wait(lambda: "■ stopped" in chat.text() and READY in chat.text(), "Esc to stop the reply")
    print(f"Esc to the stopped reply on screen: {took:.2f} s")  # issue 31 asks for < 0.5 s; not asserted


def test_a_model_name_and_a_chat_title_never_reach_the_terminal(ckpt, tmp_path):
    """Issue 31, section 2: config.json's name holds an OSC 0 (title), an OSC 52 (clipboard) and a
    CSI 2J (clear); a saved chat's first message holds `[/b]` (the chat list crashed on it)."""
    store = Store.open(tmp_path / "data")
    store.add(Saved("user", f"In BBCode, what does [/b] do? {ESCAPES}"))
    store.add(Saved("assistant", "It ends bold."))
    store.close()
    name = f"evil {ESCAPES}"
    term = start(named_checkpoint(ckpt, tmp_path, name), tmp_path, "--max-tokens", "2")

    def nothing_reached_the_terminal() -> None:
        raw = bytes(term.raw)
        assert b"\x1b]0;" not in raw and b"\x1b]52;" not in raw and b"\x1b[2J" not in raw, raw[-2000:]
        assert "PWNED" not in term.screen.title + term.screen.icon_name
        assert "^o Chats" in term.text()  # the footer, drawn once: nothing cleared the screen

    try:
        nothing_reached_the_terminal()  # the name is on screen with "ready" (the status bar)
        term.wait(f"· ready · {printable(name)[:12]}")  # cut to fit
        term.send(CTRL_O)
        term.wait("In BBCode, what does [/b] do? ␛]0;PWNED␇␛]")  # was: MarkupError, exit 1 (the rest: cut to fit)
        term.send(ESC)
        term.wait(lambda: "Esc closes" not in term.text(), "the chat list to close")
        term.send("hi\r")
        term.wait(f"─ {printable(name)} ─")  # the reply's border title
        term.wait(READY)
        nothing_reached_the_terminal()
    finally:
        term.close()


def test_ctrl_c_stays_and_ctrl_q_quits_cleanly(ckpt, tmp_path):
    term = start(ckpt, tmp_path)
    try:
        term.send(CTRL_C)  # copies; never quits (chat_app.reading)
        term.wait("Nothing selected to copy")
        term.send(CTRL_Q)
        assert term.exit_code() == 0
        assert term.modes() == {"alt_screen": False, "cursor": True, "mouse": False, "paste": False}
        assert term.echo_on()  # the terminal's line mode is back
    finally:
        term.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_mid_reply_quits_cleanly(ckpt, tmp_path, sig):
    """Before: SIGTERM mid-reply left the terminal in the alternate screen, mouse tracking on and
    the cursor hidden (exit 143, by the signal). Now it quits as Ctrl+Q does."""
    term = start(ckpt, tmp_path, "--ignore-eos", held=True)  # the reply waits after its first text
    data = tmp_path / "data"
    try:
        term.send("hi\r")
        term.wait(lambda: any(r[2] == "assistant" and r[3] for r in rows(data)), "the reply's first text saved")
        os.kill(term.pid, sig)
        assert term.exit_code() == 128 + sig
        assert term.modes() == {"alt_screen": False, "cursor": True, "mouse": False, "paste": False}
        assert all(f"\x1b[?{n}l".encode() in term.raw for n in (1000, 1003, 1006))  # every mouse mode off
        assert term.echo_on()
        assert "Traceback" not in term.text()
        reply = [r for r in rows(data) if r[2] == "assistant"]
        assert len(reply) == 1 and reply[0][3] and reply[0][5] == 1  # what streamed, saved as partial
    finally:
        term.close()


def test_up_in_an_empty_prompt_edits_the_last_message(ckpt, tmp_path):
    """Issue 34, item 7, through a real terminal's arrow key: Up loads the last message for
    editing (the border says so), Esc cancels, Enter replaces the message and its reply."""
    up, editing = "\x1b[A", "editing your last message"
    term = start(ckpt, tmp_path, "--max-tokens", "2")
    try:
        term.send("hi\r")
        term.wait(lambda: YOU in term.text() and READY in term.text() and term.input_text() == "", "the reply")
        term.send(up)
        term.wait(editing)
        typed(term, "hi")
        term.send(ESC)
        term.wait(lambda: editing not in term.text(), "Esc to cancel the edit")
        typed(term, "")
        term.send(up)
        term.wait(editing)
        term.send(" there")
        typed(term, "hi there")
        term.send("\r")
        term.wait("‹ 2/2 ›")
        term.wait(lambda: READY in term.text() and editing not in term.text(), "the edit's reply")
        assert term.text().count(YOU) == 1 and "hi there" in term.text()
        assert [(r[2], r[3]) for r in rows(tmp_path / "data")][::2] == [("user", "hi"), ("user", "hi there")]
    finally:
        term.close()


def test_versions_move_with_the_keys_a_terminal_sends(ckpt, tmp_path):
    """Issue 46, item 3: Ctrl+Left / Ctrl+Right in an empty prompt, and Left / Right on a picked
    message, as a terminal sends them (CSI 1;5 D, CSI D): an edit's old turn, then a second
    version of its reply (Ctrl+R), and back to the edit."""
    right, ctrl_r, up = "\x1b[C", "\x12", "\x1b[A"
    term = start(ckpt, tmp_path, "--max-tokens", "2")
    screen = term.text
    try:
        term.send("hi\r")
        term.wait(lambda: YOU in screen() and READY in screen() and term.input_text() == "", "the reply")
        term.send(up)
        term.wait("editing your last message")
        term.send(" there")
        typed(term, "hi there")
        term.send("\r")
        term.wait(lambda: "‹ 2/2 ›" in screen() and READY in screen(), "the edit's reply")
        term.send(CTRL_LEFT)  # the last reply has one version: the message's version before
        term.wait(lambda: "‹ 1/2 ›" in screen() and "hi there" not in screen(), "the old turn")
        term.send(ctrl_r)  # a second version of the old turn's reply
        term.wait(lambda: screen().count("‹ 1/2 ›") == 1 and "‹ 2/2 ›" in screen() and READY in screen(),
                  "the reply's new version")
        term.send(CTRL_LEFT)
        term.wait(lambda: screen().count("‹ 1/2 ›") == 2, "the reply's first version")
        term.send(TAB)  # the conversation (a binding: handled after keys the input takes itself)
        settled(term)
        term.send(HOME + right)  # pick the first message, then its version after: the edit
        term.wait(lambda: "hi there" in screen() and "‹ 2/2 ›" in screen(), "the edit again")
    finally:
        term.close()
