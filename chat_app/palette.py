"""The command palette (Ctrl+P): Textual's CommandPalette over the app's own providers, and the
names Tab completes arguments from (chat_app.completion).

Contract: `PROVIDERS` is ChatApp.COMMANDS. Textual's own system commands are left out: its
theme picker changes the theme without keeping it (/theme keeps it), F1 lists the keys, and
Ctrl+Q quits.
- CommandsProvider: the slash commands (chat_app.commands.COMMANDS). The only provider that
  discovers, so the empty palette lists the commands in the table's order. Choosing one
  that takes no argument runs it as typed; one that takes an argument puts "/name " into
  the prompt, for the user to finish (Tab completes it).
- SettingsProvider: /set's names (tinyllm.decode.sampling_params.LIMITS), each with the value in
  force and its range; choosing one puts "/set NAME " into the prompt.
- ThemesProvider: the app's themes; choosing one runs "/theme NAME" (applied, and kept).
- ChatsProvider: the saved chats whose title or text holds the query (the store's search,
  Store.chats, as the chat list filters), one its text holds ranked as if its title held it;
  choosing one opens it as the chat list does (ChatSwitcher.chosen).
- ModelsProvider: `offered_models` (the models folder's models and those saved chats were
  written with, where they still are; config.toml's [servers] by NAME; the open server's
  models, from its GET /v1/models, as URL#MODEL); choosing one runs "/model PATH" (or its hf:
  name, server NAME or URL#MODEL).
A hit is shown as "Kind: name", scored by Textual's fuzzy matcher on that text. Names that did
not come from this code (titles, model names, paths) are shown as plain text
(chat_app.labels), never as markup. A store that cannot be read gives no chats, never an
error. Imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.markup import escape

from chat_app.commands import COMMANDS
from chat_app.completion import Sources
from chat_app.labels import printable
from chat_app.shipped_models import DEFAULT_MODEL
from chat_app.store import StoreError
from chat_app.widgets.chat_list import PAGE, when
from tinyllm.decode.sampling_params import LIMITS

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from chat_app.store import Store


def models_folder() -> Path:
    """Where the shipped models are: the folder that holds the default model."""
    return DEFAULT_MODEL.parent


def known_models(store: Store, folder: Path | None = None) -> list[tuple[str, str]]:
    """(name, what /model takes) for every model known here: the models folder's (each folder in
    it), then those saved chats were written with (newest first; a local one only while it is
    still there), each once."""
    folder = models_folder() if folder is None else folder
    found: dict[str, tuple[str, str]] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.is_dir() and not entry.name.startswith((".", "_")):
            found.setdefault(str(entry.resolve()), (entry.name, str(entry)))
    try:
        used = store.models()
    except StoreError:
        used = []
    for name, where in used:
        remote = where.startswith(("hf:", "http://", "https://"))
        key = where if remote else str(Path(where).resolve())
        if remote or os.path.exists(where):
            found.setdefault(key, (name, where))
    return list(found.values())


def offered_models(app: ChatApp) -> list[tuple[str, str]]:
    """What /model, Tab and the palette offer: known_models, then the [servers] names, then the
    open server's models (as URL#MODEL), each once."""
    found = dict((where, name) for name, where in known_models(app.store))
    for name, table in app.servers.items():
        found.setdefault(name, f"server {table.get('url', '')}")
    s = app.session
    if s is not None and s.step_kind == "remote":
        url = s.path.partition("#")[0]
        for model in getattr(s, "models", []):
            found.setdefault(f"{url}#{model}", model)
    return [(name, where) for where, name in found.items()]


def completion_sources(app: ChatApp) -> Sources:
    """What Tab completes arguments from: the app's themes, /set's names with the values in
    force, the known models."""
    params = app.session.params if app.session is not None else None
    settings = {name: [] if params is None else [str(getattr(params, name)).lower()] for name in LIMITS}
    settings["seed"] = list(dict.fromkeys([*settings["seed"], "none"]))
    return Sources(themes=sorted(app.available_themes), settings=settings,
                   models=[where for _, where in offered_models(app)])


def into_prompt(app: ChatApp, text: str) -> None:
    """Put a command to finish into the prompt, the cursor at its end."""
    app.prompt.load_text(text)
    app.prompt.move_cursor(app.prompt.document.end)
    app.prompt.focus()


async def run(app: ChatApp, text: str) -> None:
    """Run a command as if typed (but not kept in the prompt's history)."""
    app.saver.user_acted()
    await app.run_command(text)


class ChatProvider(Provider):
    """What the providers share: the app, and hits shown as plain text."""

    @property
    def chat(self) -> ChatApp:
        return self.app  # type: ignore[return-value]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for shown, act, help, floor in self.entries(query):
            shown = printable(shown)
            score, offsets = matcher.fuzzy_search.match(query, shown)
            if not score and not floor:
                continue
            content = Content(shown)  # plain text (Matcher.highlight would read it as markup)
            for at in offsets:
                content = content.stylize(matcher.match_style, at, at + 1)
            yield Hit(max(score, floor), content, act, text=shown, help=escape(printable(help)) or None)

    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        """(what is shown, what choosing it does, a line of help, a score it has whatever
        the fuzzy match: a chat the store found by its text)."""
        raise NotImplementedError


class CommandsProvider(ChatProvider):
    def entries(self, query: str = "") -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        for name, (args, does) in COMMANDS.items():
            act = partial(into_prompt, self.chat, f"/{name} ") if args else partial(run, self.chat, f"/{name}")
            yield f"/{name} {args}".rstrip(), act, does, 0.0

    async def discover(self) -> Hits:
        for shown, act, does, _ in self.entries():
            yield DiscoveryHit(shown, act, text=shown, help=escape(does))


class SettingsProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        params = self.chat.session.params if self.chat.session is not None else None
        for name, (_, _, allowed) in LIMITS.items():
            now = "" if params is None else f"now {getattr(params, name)}; "
            yield f"Set: {name}", partial(into_prompt, self.chat, f"/set {name} "), now + allowed, 0.0


class ThemesProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        for name in sorted(self.chat.available_themes):
            here = " (the one in use)" if name == self.chat.theme else ""
            yield f"Theme: {name}", partial(run, self.chat, f"/theme {name}"), f"switch to it and keep it{here}", 0.0


class ChatsProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        try:
            chats = self.chat.store.chats(query, PAGE)  # its title or text holds the query; a page of them
        except StoreError:
            return
        as_title = self.matcher(query).match(f"Chat: {query}")  # a chat its text holds it in ranks as its title would
        for c in chats:
            here = "; the one open" if c.here else ""
            said = f"{when(c.updated)} · {c.model} · {c.n_messages} messages{here}"
            yield f"Chat: {c.title}", partial(self.chat.chats.chosen, c.id), said, as_title


class ModelsProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        s = self.chat.session
        open_now = s.path if s is not None and s.step_kind == "remote" else \
            str(Path(s.path).resolve()) if s is not None and s.path else None
        for name, where in offered_models(self.chat):
            local = not where.startswith(("hf:", "http://", "https://")) and where not in self.chat.servers
            here = " (open)" if (str(Path(where).resolve()) if local else where) == open_now else ""
            yield f"Model: {name}", partial(run, self.chat, f"/model {where}"), where + here, 0.0


PROVIDERS = (CommandsProvider, SettingsProvider, ThemesProvider, ChatsProvider, ModelsProvider)
