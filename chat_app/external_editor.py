"""The message in $EDITOR: Ctrl+X Ctrl+E (bash's keys) or the palette's "Edit: the message in
$EDITOR" open `$VISUAL`, else `$EDITOR`, else `vi` on the input's text; what is saved comes back.

Contract:
- `editor_command(env)`: the command, split as a shell would (shlex: `EDITOR="code -w"` is
  `code` with `-w`); a variable that is set but empty counts as unset.
- `run_editor(text, env)` writes the text to a temporary `.md` file (its own, mode 0600), runs
  the editor on it, waits, reads it back and removes it, whatever happened. It returns an
  `Edited`: the text saved (trailing newlines dropped: editors add one), or why not: an
  editor that exits non-zero changes nothing ("exited with 1"), one that cannot be started
  (not found, not executable, an unbalanced quote) says so and what to set. It raises
  nothing: it runs while the app is suspended, and an exception there would leave the
  terminal to the editor (Textual's `App.suspend` resumes only when its block ends).
- `edit_prompt(app)`: the app suspended (`App.suspend`: the terminal is the editor's until it
  exits), `run_editor` on the input's text, the app back; then the result goes into the input
  (the cursor at its end; an edit of the last message stays one), or one notice says why
  not. Text that comes back is cleaned as a paste is (chat_app.widgets.prompt_input.clean_paste:
  CR/CRLF become newlines, other control characters visible). Where the app cannot be
  suspended (no terminal: Textual's headless driver, under Pilot) it is one notice too.
- `Chord`: Ctrl+X, then Ctrl+E. The app shows it every key before anything else does
  (`ChatApp.on_event`); over the chat (no modal on top) Ctrl+X waits for the next key: Ctrl+E
  opens the editor; before any other key Ctrl+X does what it does alone (`cut`: the input's
  cut, done at once, so the key after it acts after it), then that key goes on as it came.
  Elsewhere (a modal, the chat list's filter) Ctrl+X is the input's at once.
Ctrl+E alone stays the input's end of line, Ctrl+G the graphs switch. Imports no torch.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from chat_app.widgets.prompt_input import PromptInput

PREFIX, KEY = "ctrl+x", "ctrl+e"
HOW = "set $VISUAL or $EDITOR to an editor that is installed (e.g. export EDITOR=nano)"


@dataclass
class Edited:
    text: str | None  # what was saved (None: nothing comes back)
    error: str = ""  # why not, one line ("" with text)


def editor_command(env: Mapping[str, str] | None = None) -> list[str]:
    """$VISUAL, else $EDITOR, else vi, split as a shell would (ValueError: an unbalanced quote)."""
    env = os.environ if env is None else env
    return shlex.split(env.get("VISUAL") or env.get("EDITOR") or "vi")


def run_editor(text: str, env: Mapping[str, str] | None = None) -> Edited:
    """The editor on `text` in a temporary .md file; what it saved (see the module's contract)."""
    try:
        command = editor_command(env)
    except ValueError as e:
        return Edited(None, f"Cannot read the editor command ({e}): {HOW}.")
    if not command:
        return Edited(None, f"The editor command is empty: {HOW}.")
    fd, path = tempfile.mkstemp(prefix="tinyllm-chat-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            code = subprocess.run([*command, path], env=None if env is None else dict(env)).returncode
        except OSError as e:  # not found, not executable, not a program
            return Edited(None, f"Could not start the editor {command[0]!r} ({e.strerror or e}): {HOW}.")
        if code != 0:
            return Edited(None, f"The editor exited with {code}: the message is as it was.")
        with open(path, encoding="utf-8", errors="replace") as f:
            return Edited(f.read().rstrip("\n"))
    except OSError as e:  # the temporary file: a full or read-only temp folder
        return Edited(None, f"Could not edit in a temporary file ({e.strerror or e}): the message is as it was.")
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


class EditorHost(Protocol):
    """What edit_prompt needs of the app (chat_app.app.ChatApp is one)."""

    @property
    def prompt(self) -> PromptInput: ...
    def suspend(self) -> AbstractContextManager[None]: ...
    def say(self, message: str, severity: str = "information") -> None: ...


def edit_prompt(app: EditorHost) -> None:
    """The input's text in the editor, the app suspended meanwhile; the saved text back in the input."""
    from textual.app import SuspendNotSupported

    from chat_app.widgets.prompt_input import clean_paste

    prompt = app.prompt
    try:
        with app.suspend():
            edited = run_editor(prompt.text)
    except SuspendNotSupported:
        app.say("The editor needs the terminal, and this app has none to lend it.", "warning")
        return
    if edited.text is None:
        app.say(edited.error, "warning")
        return
    prompt.load_text(clean_paste(edited.text))
    prompt.move_cursor(prompt.document.end)
    prompt.focus()


def cut(focused: object) -> None:
    """What Ctrl+X alone does where the chord takes it: the input's cut (the selection, else the
    line, to the clipboard); nothing elsewhere."""
    from chat_app.widgets.prompt_input import PromptInput

    if isinstance(focused, PromptInput) and not focused.read_only:
        focused.insert_typed()  # keys typed before Ctrl+X go in first
        focused.action_cut()


class Chord:
    """Ctrl+X Ctrl+E, seen before the input sees either key."""

    def __init__(self) -> None:
        self.waiting = False  # Ctrl+X came, held back: the next key decides

    def key(self, key: str, over_chat: bool) -> str:
        """What to do with a key: "wait" (take it: it may begin the chord), "edit" (the chord is
        complete), "replay" (Ctrl+X goes on first, then this key), "pass" (as it came)."""
        if self.waiting:
            self.waiting = False
            return "edit" if key == KEY else "replay"
        if key == PREFIX and over_chat:
            self.waiting = True
            return "wait"
        return "pass"
