"""Issue 52, part 3: the message in $EDITOR (Ctrl+X Ctrl+E, the palette). The editor is a small
Python script written to tmp_path: one that rewrites the file it is given, one that exits 1.
`run_editor` is tested directly; the keys under Pilot with App.suspend made a no-op (Textual's
headless driver cannot suspend: that path is a notice, tested too); the real suspend, with the
keys a terminal sends, in a pseudo-terminal (tests/chat_app/pty_terminal.py). Waits on state."""

from __future__ import annotations

import contextlib
import json
import stat
import sys
from pathlib import Path

import pytest

from chat_app.external_editor import editor_command, run_editor
from tests.chat_app.conftest import loaded, notices, wait_until
from tests.chat_app.test_palette import choose

pytestmark = pytest.mark.anyio

REWRITE = """
import json, sys
path = sys.argv[-1]
text = open(path, encoding="utf-8").read()
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "text": text, "suffix": path[-3:]}}) + "\\n")
open(path, "w", encoding="utf-8").write("Edited: " + text + "\\nsecond line\\r\\n\\x1b[2J\\n")
"""


def editor(tmp_path: Path, body: str, name: str = "edit") -> Path:
    """An executable Python script (the editor); what it was given is logged to <name>.log."""
    script = tmp_path / name
    script.write_text(f"#!{sys.executable}\n" + body.format(log=str(tmp_path / f"{name}.log")))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def calls(tmp_path: Path, name: str = "edit") -> list[dict]:
    log = tmp_path / f"{name}.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_editor_command():
    assert editor_command({"VISUAL": "code -w", "EDITOR": "nano"}) == ["code", "-w"]
    assert editor_command({"VISUAL": "", "EDITOR": "'my editor' --flag"}) == ["my editor", "--flag"]
    assert editor_command({}) == ["vi"]


def test_run_editor_gives_back_what_was_saved(tmp_path):
    script = editor(tmp_path, REWRITE)
    edited = run_editor("draft", {"EDITOR": f"{script} --wait"})
    assert edited.text == "Edited: draft\nsecond line\n\x1b[2J" and edited.error == ""  # CRLF read as a newline
    (call,) = calls(tmp_path)
    assert call["argv"][0] == "--wait" and call["text"] == "draft" and call["suffix"] == ".md"
    assert not Path(call["argv"][1]).exists()  # the temporary file is gone


def test_an_editor_that_fails_or_cannot_start_changes_nothing(tmp_path):
    failing = editor(tmp_path, "import sys\nopen(sys.argv[-1], 'w').write('half')\nsys.exit(1)\n", "fail")
    edited = run_editor("draft", {"EDITOR": str(failing)})
    assert edited.text is None and "exited with 1" in edited.error
    missing = run_editor("draft", {"EDITOR": str(tmp_path / "no-such-editor")})
    assert missing.text is None and "Could not start the editor" in missing.error and "$EDITOR" in missing.error
    quote = run_editor("draft", {"EDITOR": "vi 'unbalanced"})
    assert quote.text is None and "Cannot read the editor command" in quote.error


@pytest.fixture
def suspendable(monkeypatch):
    """App.suspend as a no-op: the editor runs as it would in a terminal (Pilot has none)."""
    from textual.app import App

    monkeypatch.setattr(App, "suspend", lambda self: contextlib.nullcontext())


async def test_ctrl_x_ctrl_e_and_the_palette_edit_the_input(make_app, tmp_path, monkeypatch, suspendable):
    script = editor(tmp_path, REWRITE)
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", str(script))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.prompt.load_text("draft")
        await pilot.press("ctrl+x", "ctrl+e")
        await wait_until(pilot, lambda: app.prompt.text.startswith("Edited:"), what="the edited text")
        # what came back is cleaned as a paste is: CRLF a newline, ESC visible; the trailing newline gone
        assert app.prompt.text == "Edited: draft\nsecond line\n\u241b[2J" and app.prompt.has_focus
        assert app.prompt.cursor_location == app.prompt.document.end
        app.prompt.load_text("again")
        await choose(pilot, "editor", "Edit: the message in $EDITOR")  # Ctrl+P, the query, Enter
        await wait_until(pilot, lambda: app.prompt.text.startswith("Edited: again"), what="the palette's edit")
        assert len(calls(tmp_path)) == 2

        monkeypatch.setenv("EDITOR", str(editor(tmp_path, "import sys\nsys.exit(1)\n", "fail")))
        app.prompt.load_text("keep me")
        await pilot.press("ctrl+x", "ctrl+e")
        await wait_until(pilot, lambda: any("exited with 1" in n for n in notices(app)), what="the notice")
        assert app.prompt.text == "keep me"
        monkeypatch.setenv("EDITOR", str(tmp_path / "nothing-here"))
        await pilot.press("ctrl+x", "ctrl+e")
        await wait_until(pilot, lambda: any("Could not start the editor" in n for n in notices(app)))
        assert app.prompt.text == "keep me"


async def test_ctrl_x_and_ctrl_e_alone_stay_the_inputs(make_app, tmp_path, monkeypatch, suspendable):
    monkeypatch.setenv("VISUAL", str(editor(tmp_path, REWRITE)))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.prompt.load_text("one two")
        app.prompt.move_cursor((0, 0))
        await pilot.press("ctrl+e")  # end of line, as TextArea has it
        assert app.prompt.cursor_location == (0, 7)
        await pilot.press("ctrl+x", "x")  # Ctrl+X then another key: the input's cut, then the key
        await wait_until(pilot, lambda: app.prompt.text == "x", what="the cut line, then x")
        assert calls(tmp_path) == []  # no editor ran


async def test_without_a_terminal_to_lend_it_is_one_notice(make_app, tmp_path, monkeypatch):
    monkeypatch.setenv("VISUAL", str(editor(tmp_path, REWRITE)))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.prompt.load_text("draft")
        await pilot.press("ctrl+x", "ctrl+e")
        await wait_until(pilot, lambda: any("needs the terminal" in n for n in notices(app)))
        assert app.prompt.text == "draft" and calls(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no pseudo-terminals")
def test_in_a_real_terminal_the_editor_gets_it_and_gives_it_back(ckpt, tmp_path, monkeypatch):
    """The real App.suspend: the app leaves the terminal to the editor (which sees a terminal on
    its stdin and stdout) and takes it back, showing what was saved in the input."""
    from tests.chat_app.pty_terminal import Terminal
    from tests.chat_app.test_pty import start

    script = editor(tmp_path, REWRITE.replace("import json, sys", "import json, os, sys\n"
                                              "assert os.isatty(0) and os.isatty(1)"))
    monkeypatch.setenv("VISUAL", f"{script} --wait")  # start() passes the environment on
    term: Terminal = start(ckpt, tmp_path)
    try:
        term.send("draft")
        term.wait(lambda: term.input_text() == "draft", "the typed text")
        term.send("\x18\x05")  # Ctrl+X Ctrl+E, the bytes a terminal sends
        term.wait(lambda: term.input_text().startswith("Edited: draft"), "the edited text in the input")
        assert term.input_text().split("\n")[:2] == ["Edited: draft", "second line"]
        (call,) = calls(tmp_path)
        assert call["text"] == "draft" and call["argv"][0] == "--wait"
        term.send(" ok")  # the app has its keys back
        term.wait(lambda: term.input_text().endswith("␛[2J ok"), "a key typed after the editor, at the end")
        assert term.exit_code(wait=False) is None
    finally:
        term.close()



STOPPED = """
import os, signal, sys
with open({log!r}, "a") as log:
    log.write(str(os.getpid()) + "\\n")
os.killpg(0, signal.SIGTSTP)  # Ctrl+Z in the editor: the terminal signals its foreground group, the app too
os.kill(os.getpid(), signal.SIGSTOP)  # and the editor stops itself, as vim does on SIGTSTP
open(sys.argv[-1], "w", encoding="utf-8").write("after fg")
"""


def test_ctrl_z_in_the_editor_stops_the_app_with_it_and_fg_brings_both_back(ckpt, tmp_path, monkeypatch):
    """Job control while the editor has the terminal: the app, waiting on the editor, stops with
    it, so the shell gets its prompt back; SIGCONT (`fg`) goes on with the editor, whose text
    reaches the input. (Had the app put its stop off to its event loop, which waits on the
    editor, it would have run on and the shell would have waited for the job forever.)"""
    import os
    import signal

    from tests.chat_app.pty_terminal import Terminal
    from tests.chat_app.test_pty import start

    script = editor(tmp_path, STOPPED, "stop")
    monkeypatch.setenv("VISUAL", str(script))
    term: Terminal = start(ckpt, tmp_path)
    try:
        def state(pid: int) -> str:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        def editor_stopped() -> bool:
            log = tmp_path / "stop.log"  # the editor's pid, once it runs
            return log.exists() and bool(log.read_text()) and state(int(log.read_text())) == "T"

        term.send("\x18\x05")  # Ctrl+X Ctrl+E
        term.wait(editor_stopped, "the editor to stop")
        term.wait(lambda: state(term.pid) == "T", "the app to stop with it")
        os.killpg(term.pid, signal.SIGCONT)  # fg: the job's whole group goes on
        term.wait(lambda: term.input_text() == "after fg", "the editor's text in the input")
        term.send(" ok")
        term.wait(lambda: term.input_text() == "after fg ok", "the app's keys back")
    finally:
        term.close()
