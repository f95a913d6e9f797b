"""PromptInput: where the user types (a TextArea that sends on Enter).

Keys: Enter sends (posts `PromptInput.Submitted`); Shift+Enter and Ctrl+J insert a newline
(tmux does not pass Shift+Enter on, Ctrl+J always arrives); Up on the first line recalls
earlier prompts (`prompts`: the app fills it with earlier runs' too), Down on the last line
walks forward again and finally restores the draft.
Editing: Up in an empty prompt, where the chat has a user message (`last_message()`, the app's),
loads that message for editing (`edit_message`): the border says so, Enter submits it with
`Submitted.replaces` set to the message it replaces, Esc cancels (the prompt empty again,
nothing changed). Up on the first line of an edit walks the earlier prompts (skipping the
message edited, which is the newest); Down past the newest comes back to the edit.
The input does not clear itself: the app calls `accept(event)` when it takes the text, and
only the submitted text leaves (what was typed after Enter, before the app took it, stays);
a refused message stays where it was typed, and `give_back(text)` restores one that failed.
A message of nothing but "^" (what a terminal leaves of a fast Ctrl key) is not sent.
PgUp/PgDn (and Home/End while the input is empty) are for the conversation: the input posts
`PromptInput.Scrolled(key)` and the app scrolls. Ctrl+Left/Ctrl+Right in an empty input post
`PromptInput.Versions(step)`: the last reply's other versions (chat_app.versions).
Pasted text is cleaned: CR/CRLF become newlines, other control characters (ESC, Ctrl+Q, ...)
become visible symbols, so a paste is text, never keystrokes.
Typed characters that come in a burst (a terminal without bracketed paste, tmux send-keys) go
into the text as one edit: a printable key joins `_typed`, and that goes in once the keys
already queued have been handled, or before anything else reads or changes the text (any
other key, a paste, a click, `text`, `replace`, `load_text`). Each edit of a line rewraps it
and each frame renders it whole (Textual's TextArea), so one edit per key made typing
quadratic in the line's length: 5 KB typed took 5.8 s, 20 KB 62 s. A key bound on the input
(an arrow, Home, Backspace) acts as it arrives, in order with the letters around it.
Attachments (chat_app.attachments): `attach(items)` (/read's) holds files for the next message,
shown as chips above the input (chat_app.widgets.attachment_bar, which the input mounts over
itself); `@PATH` words in a message attach what they name when it is sent (the word stays in
the text; one that names nothing on disk is text, as `@alice` is). Enter sends
`compose(chips, text)`: each file fenced under its name, then the text (`Submitted.attached`
lists them; a /command is never composed: the chips wait for the next message). A paste that
would bring the input past PASTE_CHARS characters becomes a chip, "pasted text", instead of
text in the input: the TextArea rewraps and renders its text on every key, 1.6 s a key with
1 MB on one line (scripts/big_input_keys.py). Past MAX_BYTES in all, a file or a paste is
refused with one line (a notice); nothing is attached. A message that comes back (`give_back`,
an edit, a recalled prompt) brings its fenced files back as chips (`split`). Backspace at the
input's very start removes the last chip; a chip's "×", clicked, removes that one.
Tab completes a /command and its arguments (chat_app.completion, from what `sources()` gives:
the app's themes, settings, models) while the cursor is at the end of a one-line /command:
as far as the candidates agree; where they part, the first Tab lists them under the input
(its border's subtitle, what the next Tab puts in first) and each Tab after puts the next one
in, round and round; any other key ends the list. An `@PATH` word at the cursor completes as a
path, anywhere in the text. Where there is nothing to complete, Tab
moves the focus on (to the conversation), as it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from chat_app.attachments import Attachment, check_total, compose, gather, mentions, merged, split
from chat_app.completion import Completion, Sources, complete
from chat_app.labels import plain
from chat_app.widgets.attachment_bar import AttachmentBar

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline")
EDITING = "editing your last message · Enter replaces it and its reply · Esc cancels"
# Pasted control characters (but tab and newline) become their Unicode "control pictures".
_PASTE = {c: 0x2400 + c for c in range(32) if chr(c) not in "\t\n"} | {0x7F: 0x2421}
# A paste that would bring the input past this many characters is an attachment instead: a key
# took 24 ms (CPU) with 8,000 on one line, 43 ms with 20,000, 1.6 s with 1 MB (docs/BENCHMARKS.md).
PASTE_CHARS = 8_000
PASTED = "pasted text"


def short(choice: str) -> str:
    """A candidate as the list under the input shows it: a path's last part ("smollm2/")."""
    folder = choice.endswith("/") and len(choice) > 1
    return choice.rstrip("/").rpartition("/")[2] + "/" * folder if "/" in choice.rstrip("/") else choice


def clean_paste(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_PASTE)


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str  # the message (stripped), its attachments fenced before it (chat_app.attachments.compose)
        raw: str = field(default="", repr=False)  # the whole input when Enter was pressed
        replaces: str | None = None  # an edit: the message it replaces (as loaded); None: a new one
        attached: tuple[Attachment, ...] = field(default=(), repr=False)  # the chips (and @PATHs) it carries

    @dataclass
    class Scrolled(Message):
        key: str  # "pageup" | "pagedown" | "home" | "end"

    @dataclass
    class Versions(Message):
        step: int  # -1: the version before; 1: the one after (chat_app.versions)

    def __init__(self, sources: Callable[[], Sources] = Sources, **kwargs) -> None:
        super().__init__(soft_wrap=True, tab_behavior="focus", show_line_numbers=False, **kwargs)
        self.prompts: list[str] = []
        self._recalled: int | None = None  # index into history while browsing it
        self._draft = ""
        self._draft_edits: str | None = None  # ... the message the draft was an edit of
        self._newest = 0  # ... the index past the newest prompt shown (the draft's)
        self.sources = sources  # what Tab completes arguments from
        self._listed: Completion | None = None  # the candidates the last Tab listed ...
        self._shown = ""  # ... and the text it left
        self._turn = -1  # the listed candidate the input holds (-1: none yet)
        self._after = ""  # the text after the cursor while completing (an @PATH mid-text)
        self.last_message: Callable[[], str | None] = lambda: None  # the app's: what Up in an empty prompt edits
        self.editing: str | None = None  # the message being edited, as loaded; None: not editing
        self._typed = ""  # printable keys not yet in the text (a burst goes in as one edit)
        self.attachments: list[Attachment] = []  # what the next message carries (the chips)
        self._draft_chips: list[Attachment] = []  # ... the draft's, while earlier prompts are shown
        self.bar = AttachmentBar(self.detach)

    def on_mount(self) -> None:
        if self.parent is not None and not self.bar.is_attached:
            self.parent.mount(self.bar, before=self)

    @property
    def text(self) -> str:  # type: ignore[override]
        self.insert_typed()
        return TextArea.text.fget(self)  # type: ignore[attr-defined]

    @text.setter
    def text(self, text: str) -> None:
        self.insert_typed()
        TextArea.text.fset(self, text)  # type: ignore[attr-defined]

    def insert_typed(self) -> None:
        """The keys typed so far into the text, at the cursor, as one edit."""
        if self._typed:
            typed, self._typed = self._typed, ""
            start, end = self.selection
            self._replace_via_keyboard(typed, start, end)

    def replace(self, *args, **kwargs):
        self.insert_typed()
        return super().replace(*args, **kwargs)

    def load_text(self, text: str) -> None:
        self.insert_typed()
        super().load_text(text)

    async def _on_mouse_down(self, event: events.MouseDown) -> None:
        self.insert_typed()
        await super()._on_mouse_down(event)

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character and event.key not in NEWLINE_KEYS and not self.read_only:
            event.stop()
            event.prevent_default()
            self._restart_blink()
            self._end_completion()
            if not self._typed:
                self.call_later(self.insert_typed)  # after the keys queued now
            self._typed += event.character
            return
        self.insert_typed()
        if event.key == "tab" and self._complete():
            event.stop()
            event.prevent_default()
            return
        if event.key != "tab":
            self._end_completion()
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self._submit()
            return
        if event.key == "backspace" and self.attachments and self.selection.is_empty \
                and self.cursor_location == (0, 0):
            event.stop()
            event.prevent_default()
            self.detach(len(self.attachments) - 1)
            return
        if event.key in ("pageup", "pagedown") or event.key in ("home", "end") and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.Scrolled(event.key))
            return
        if event.key in ("ctrl+left", "ctrl+right") and not self.text:  # no word to move over
            event.stop()
            event.prevent_default()
            self.post_message(self.Versions(-1 if event.key == "ctrl+left" else 1))
            return
        if event.key == "escape" and self.editing is not None:
            event.stop()
            event.prevent_default()
            self.end_edit()
            self._recalled = None
            self.clear()
            self._set_chips([])
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if await self._run_own_binding(event):
            return
        await super()._on_key(event)

    async def _run_own_binding(self, event: events.Key) -> bool:
        """A key bound on the input itself (the arrows, Home, Backspace, ...) acts now, in its
        place among the keys. Left to bubble up to the app's binding check, it acted after the
        letters sent behind it ("ab", Left, Left, "X" in one burst gave "abX"). The input is
        the first place that check looks, so the same binding wins; priority bindings were
        checked before the key reached the input."""
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if not binding.priority and await self.app.run_action(binding.action, self):
                event.stop()
                event.prevent_default()
                return True
        return False

    def _submit(self) -> None:
        """Enter: the message, with its chips and the files its @PATH words name, fenced before it."""
        raw = self.text
        text = raw.strip()
        if text.startswith("/"):  # a command: the chips wait for the next message
            self.post_message(self.Submitted(text, raw, self.editing))
            return
        attached = list(self.attachments)
        try:
            for word in mentions(text):
                attached = merged(attached, gather(word)[0])
            check_total(attached)
        except ValueError as e:
            self.notify(f"Not sent: {e}", severity="error", markup=False, timeout=8)
            return
        if text.strip("^ \n") or attached:
            self.post_message(self.Submitted(compose(attached, text if text.strip("^ \n") else ""), raw,
                                             self.editing, tuple(attached)))
        elif text:  # only stray carets: nothing anyone meant to send
            self.clear()

    def attach(self, items: list[Attachment]) -> None:
        """Hold `items` for the next message (attachments.merged: the same file again is replaced);
        ValueError, and nothing attached, past MAX_BYTES in all."""
        together = merged(self.attachments, items)
        check_total(together)
        self._set_chips(together)

    def detach(self, index: int) -> None:
        """The index-th chip goes (a click on its ×, Backspace at the input's start)."""
        if 0 <= index < len(self.attachments):
            self._set_chips(self.attachments[:index] + self.attachments[index + 1:])

    def _set_chips(self, attachments: list[Attachment]) -> None:
        self.attachments = attachments
        self.bar.show(attachments)

    def _load_message(self, message: str) -> None:
        """A message back in the input: its fenced files as chips, its text as text."""
        attachments, text = split(message)
        self._set_chips(attachments)
        self.load_text(text)
        self.move_cursor(self.document.end)

    def accept(self, submitted: PromptInput.Submitted) -> bool:
        """The app took the submitted text: remember it and take it out of the input; text
        typed after Enter stays. True when it is new in the history (not a repeat)."""
        text = submitted.text
        new = bool(text) and (not self.prompts or self.prompts[-1] != text)
        if new:
            self.prompts.append(text)
        self._recalled, self._draft = None, ""
        self.end_edit()
        if submitted.attached:
            self._set_chips([a for a in self.attachments if a not in submitted.attached])
        now, raw = self.text, submitted.raw or submitted.text
        if now == raw or now.strip() == raw.strip():
            self.clear()
        elif now.startswith(raw):
            self.load_text(now[len(raw):].lstrip("\n"))
            self.move_cursor(self.document.end)
        # else: the input was changed some other way since Enter; leave it alone
        return new

    def edit_message(self, message: str, text: str | None = None) -> None:
        """Edit `message` (the chat's last user message): `text` (default: the message) in the
        input, the border saying what Enter and Esc do."""
        self.editing = message
        self._load_message(message if text is None else text)
        self.border_title = EDITING
        self.add_class("-editing")

    def end_edit(self) -> None:
        """Not editing any more (the text stays)."""
        self.editing = None
        self.border_title = None
        self.remove_class("-editing")

    def give_back(self, text: str) -> None:
        """A message that could not be sent returns to the input (before anything typed since),
        its files as chips again (before any attached since)."""
        now, chips = self.text, self.attachments
        self._load_message(text)
        self._set_chips(merged(self.attachments, chips))
        if now.strip():
            self.load_text(self.text + "\n" + now)
            self.move_cursor(self.document.end)

    async def _on_paste(self, event: events.Paste) -> None:
        event.stop()
        event.prevent_default()
        self.insert_typed()
        self._end_completion()
        if self.read_only or not (text := clean_paste(event.text)):
            return
        if len(text) + len(self.document.text) <= PASTE_CHARS:
            result = self.replace(text, *self.selection)
            self.move_cursor(result.end_location)
            return
        names = {a.name for a in self.attachments}
        name = next(n for i in range(1, len(names) + 2) if (n := PASTED if i == 1 else f"{PASTED} {i}") not in names)
        try:
            self.attach([Attachment(name, text)])
        except ValueError as e:
            self.notify(f"Paste refused: {e}", severity="error", markup=False, timeout=8)

    # ---- Tab completion -----------------------------------------------------------------

    def _complete(self) -> bool:
        """Tab: complete the /command at the cursor; False when there is nothing to complete."""
        text = self.text
        if self._listed is not None and text == self._shown:  # Tab again: the next candidate
            self._turn += 1
            self._show(self._listed.choice(self._turn))
            self._list(self._turn + 1)
            return True
        self._end_completion()
        end = self.document.end
        before = self.document.get_text_range((0, 0), self.cursor_location)
        self._after = self.document.get_text_range(self.cursor_location, end)
        if self._after and not before.rpartition(" ")[2].rpartition("\n")[2].startswith("@"):
            return False  # a /command completes at the end only; an @PATH anywhere
        found = complete(before, self.sources())
        if found is None:
            return False
        extended = found.extended()
        if extended is not None:
            self._show(extended)
        elif len(found.choices) == 1:
            return False  # the word is whole already
        if len(found.choices) > 1:
            self._listed, self._shown = found, self.text
            self._list(0)
        return True

    def _list(self, turn: int) -> None:
        """Under the input: what the next Tabs put in, the next one first."""
        assert self._listed is not None
        choices = self._listed.choices
        turn %= len(choices)
        self.border_subtitle = plain("Tab: " + "  ".join(map(short, choices[turn:] + choices[:turn])))

    def _show(self, text: str) -> None:
        """The text before the cursor completed (what follows the cursor stays after it)."""
        self.load_text(text + self._after)
        self.move_cursor((text.count("\n"), len(text.rpartition("\n")[2])))
        self._shown = text + self._after

    def _end_completion(self) -> None:
        if self._listed is not None:
            self._listed, self._turn = None, -1
            self.border_subtitle = ""

    # ---- history --------------------------------------------------------------------

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0:
            if not self.text and not self.attachments and self.editing is None and self._recalled is None \
                    and (last := self.last_message()) is not None:
                self.edit_message(last)
                return
            if self._recall(-1):
                return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == self.document.line_count - 1 and self._recall(+1):
            return
        super().action_cursor_down(select)

    def _recall(self, step: int) -> bool:
        """Show the previous (step -1) or next (+1) prompt; False when there is none."""
        if self._recalled is None:
            if step > 0 or not self.prompts:
                return False
            skip = self.editing is not None and self.prompts[-1] == self.editing  # on screen already
            self._draft, self._draft_edits, self._draft_chips = self.text, self.editing, self.attachments
            self._recalled = self._newest = len(self.prompts) - skip
        at = self._recalled + step
        if at < 0:  # already at the oldest (none earlier than an edit: it stays as it is)
            self._recalled = None if self._recalled == self._newest else self._recalled
            return True
        if at >= self._newest:
            self._recalled = None
            if self._draft_edits is not None:
                self.edit_message(self._draft_edits, self._draft)
                self._set_chips(self._draft_chips)
                return True
            self.load_text(self._draft)
            self.move_cursor(self.document.end)
            self._set_chips(self._draft_chips)
            return True
        self._recalled = at
        self.end_edit()
        self._load_message(self.prompts[at])
        return True


