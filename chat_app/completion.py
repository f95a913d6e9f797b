"""Tab completion in the prompt: a slash command's name, then its arguments.

Contract: `complete(text, sources)` takes the prompt's whole text (the cursor at its end) and
returns a `Completion` (the word under completion and what it may become), or None when there
is nothing to complete: the text is not a /command, or no candidate starts with what was
typed. Arguments are split as chat_app.commands runs them (`/name ARG`, `/set NAME VALUE`), and
completed from `Sources`: `/set` a setting's name, then its value (the one in force); `/theme`
a theme's name; `/model` a known model (by its path or hf: name, or by its file's or folder's
name alone) or any path; `/export` (and `/export!`) and `/read` a path. `/system` takes free
text: nothing. In any other text (a message, over several lines too), a last word that starts
with "@" completes as a path (`@PATH`: a file it attaches, chat_app.attachments.mentions).
Matching is by prefix, case-sensitive, but a model's name, which is matched whatever its case.

What a Tab does with it (the prompt does this; see `Completion`) is what zsh does by default: the
word is completed as far as every candidate agrees (`extended`), a single candidate whole, with
a space after it where another argument follows (`/th` -> `/theme `); where that adds nothing
(the candidates part at the cursor) the candidates are listed, and Tab again puts each in
turn (`choice(turn)`), round and round. Paths are the one place the file system is read
(`Sources.files`, by default `paths`): folders end in "/", dot files show only once a "." is
typed. Imports neither torch nor textual.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from chat_app.commands import COMMANDS


def paths(word: str) -> list[str]:
    """The paths `word` may become (as typed: "~/" stays "~/"): the entries of its folder
    that start with its last part, a folder with "/" after it. [] where the folder is unreadable."""
    cut = word.rfind("/") + 1
    folder, stem = word[:cut], word[cut:]
    where = os.path.expanduser(folder) if folder else "."
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith(stem) and (stem.startswith(".") or not name.startswith(".")):
            out.append(folder + name + ("/" if os.path.isdir(os.path.join(where, name)) else ""))
    return out


@dataclass(frozen=True)
class Sources:
    """What arguments complete to (the app builds one per Tab: chat_app.palette)."""
    themes: Sequence[str] = ()  # /theme's names
    settings: Mapping[str, Sequence[str]] = field(default_factory=dict)  # /set's names: the values offered
    models: Sequence[str] = ()  # known models, as /model takes them: paths and hf: names
    files: Callable[[str], list[str]] = paths  # a path as typed -> the paths it may become


@dataclass(frozen=True)
class Completion:
    head: str  # the text before the word under completion
    word: str  # the word as typed
    choices: tuple[str, ...]  # what the word may become (at least one)
    more: bool = False  # another argument follows the word: a whole one gets a space after it

    def extended(self) -> str | None:
        """The text with the word completed as far as every choice agrees (a single choice
        whole, and a space where `more`); None when that changes nothing."""
        if len(self.choices) == 1:
            text = self.head + self.choices[0] + (" " if self.more else "")
        else:
            prefix = os.path.commonprefix(list(self.choices))
            text = self.head + prefix if prefix.startswith(self.word) else self.head + self.word
        return None if text == self.head + self.word else text

    def choice(self, turn: int) -> str:
        """The text with the word replaced by the turn-th choice (turns go round)."""
        return self.head + self.choices[turn % len(self.choices)]


def complete(text: str, sources: Sources) -> Completion | None:
    word = text.rpartition(" ")[2].rpartition("\n")[2]
    if word.startswith("@") and not (text.startswith("/") and "\n" not in text):  # @PATH in a message
        return _completion(text[:len(text) - len(word) + 1], word[1:], sources.files(word[1:]))
    if not text.startswith("/") or "\n" in text:
        return None
    name, space, rest = text[1:].partition(" ")
    if not space:  # the command's own name
        names = sorted(n for n in COMMANDS if n.startswith(name))
        more = len(names) == 1 and bool(COMMANDS[names[0]][0])
        return _completion("/", name, names, more)
    head = f"/{name} "
    if name == "set":
        key, space, value = rest.partition(" ")
        if not space:
            return _completion(head, key, [k for k in sources.settings if k.startswith(key)], more=True)
        offered = sources.settings.get(key.replace("-", "_"), ())
        return _completion(f"{head}{key} ", value, [v for v in offered if v.startswith(value)])
    if name == "theme":
        return _completion(head, rest, [t for t in sources.themes if t.startswith(rest)])
    if name == "model":
        known = [m for m in sources.models if m.startswith(rest) or PurePath(m).name.lower().startswith(rest.lower())]
        looks_like_path = rest.startswith(("/", ".", "~")) or "/" in rest
        found = [*known, *(p for p in sources.files(rest) if p not in known)] if looks_like_path else known
        return _completion(head, rest, found)
    if name in ("export", "export!", "read"):
        return _completion(head, rest, sources.files(rest))
    return None


def _completion(head: str, word: str, choices: list[str], more: bool = False) -> Completion | None:
    choices = list(dict.fromkeys(choices))  # each once, in order
    return Completion(head, word, tuple(choices), more) if choices else None
