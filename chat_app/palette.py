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
- ModelsProvider: `offered_models` (chat_app.known_models: the models folder's models and those saved chats were
  written with, where they still are; config.toml's [servers] by NAME; the open server's
  models, from its GET /v1/models, as URL#MODEL); choosing one runs "/model PATH" (or its hf:
  name, server NAME or URL#MODEL).
- EditorProvider: "Edit: the message in $EDITOR", what Ctrl+X Ctrl+E does (chat_app.external_editor),
  run once the palette has gone.
A hit is shown as "Kind: name", scored by Textual's fuzzy matcher on that text. Names that did
not come from this code (titles, model names, paths) are shown as plain text
(chat_app.labels), never as markup. A store that cannot be read gives no chats, never an
error. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.markup import escape

from chat_app.commands import COMMANDS
from chat_app.completion import Sources
from chat_app.known_models import known_models, offered_models  # noqa: F401 (known_models: the tests')
from chat_app.labels import printable
from chat_app.store import StoreError
from chat_app.widgets.chat_list import PAGE, when
from tinyllm.decode.sampling_params import LIMITS

if TYPE_CHECKING:
    from chat_app.controller import ChatController
    from chat_app.widgets.prompt_input import PromptInput


class ChatHost(Protocol):
    """What the palette needs of the app (chat_app.app.ChatApp is one)."""

    controller: ChatController
    theme: str

    @property
    def available_themes(self) -> dict[str, Any]: ...
    @property
    def prompt(self) -> PromptInput: ...
    def action_external_editor(self) -> None: ...
    def call_after_refresh(self, callback: Callable[[], Any]) -> bool: ...


def completion_sources(app: ChatHost) -> Sources:
    """What Tab completes arguments from: the app's themes, /set's names with the values in
    force, the known models."""
    core = app.controller.core
    params = core.session.params if core.session is not None else None
    settings = {name: [] if params is None else [str(getattr(params, name)).lower()] for name in LIMITS}
    settings["seed"] = list(dict.fromkeys([*settings["seed"], "none"]))
    return Sources(themes=sorted(app.available_themes), settings=settings,
                   models=[where for _, where in offered_models(core.store, core.servers, core.session)])


def into_prompt(app: ChatHost, text: str) -> None:
    """Put a command to finish into the prompt, the cursor at its end."""
    app.prompt.load_text(text)
    app.prompt.move_cursor(app.prompt.document.end)
    app.prompt.focus()


async def run(app: ChatHost, text: str) -> None:
    """Run a command as if typed (but not kept in the prompt's history)."""
    await app.controller.run_command(text)


class ChatProvider(Provider):
    """What the providers share: the app, and hits shown as plain text."""

    @property
    def chat(self) -> ChatHost:
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
        s = self.chat.controller.session
        params = s.params if s is not None else None
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
            chats = self.chat.controller.core.store.chats(query, PAGE)  # its title or text holds the query; a page of them
        except StoreError:
            return
        as_title = self.matcher(query).match(f"Chat: {query}")  # a chat its text holds it in ranks as its title would
        for c in chats:
            here = "; the one open" if c.here else ""
            said = f"{when(c.updated)} · {c.model} · {c.n_messages} messages{here}"
            yield f"Chat: {c.title}", partial(self.chat.controller.chats.chosen, c.id), said, as_title


class ModelsProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        core = self.chat.controller.core
        s = core.session
        open_now = s.path if s is not None and s.capabilities.served else \
            str(Path(s.path).resolve()) if s is not None and s.path else None
        for name, where in offered_models(core.store, core.servers, s):
            local = not where.startswith(("hf:", "http://", "https://")) and where not in core.servers
            here = " (open)" if (str(Path(where).resolve()) if local else where) == open_now else ""
            yield f"Model: {name}", partial(run, self.chat, f"/model {where}"), where + here, 0.0


class EditorProvider(ChatProvider):
    def entries(self, query: str) -> Iterable[tuple[str, Callable[[], Any], str, float]]:
        yield ("Edit: the message in $EDITOR", partial(self.chat.call_after_refresh, self.chat.action_external_editor),
               "Ctrl+X Ctrl+E: the input's text in $VISUAL, else $EDITOR, else vi; what you save comes back", 0.0)


PROVIDERS = (CommandsProvider, SettingsProvider, ThemesProvider, ChatsProvider, ModelsProvider, EditorProvider)
