"""ChatScreen: the chat's one screen, the `View` (chat_app.view) its controller draws through.

Contract: it composes the conversation, the input, the load bar, the status bar and the
footer (what the user does in them bubbles up to the app, which passes it to the controller:
chat_app.app). It draws nothing of its own accord: every change to the chat comes from the
controller (chat_app.controller), through the View's methods. Notices: `say` is a toast that
stays as long as it takes to read (`notice_seconds`), `note` a note in the conversation. Any
text a notice echoes (a path, a model's name, what was typed) is plain text, never markup
(chat_app.labels). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.screen import Screen
from textual.widgets import Footer

from chat_app.labels import printable
from chat_app.widgets.chat_list import ChatList
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.load_progress import LoadProgress
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from chat_app.completion import Sources
    from chat_app.controller import ChatController


def notice_seconds(message: str, severity: str = "information") -> float:
    """How long a notice stays: 2 s and about 4 words a second for information, at most 6 s;
    a warning or an error 8 s (what went wrong is worth the time)."""
    if severity != "information":
        return 8.0
    return min(6.0, 2.0 + len(message.split()) / 4)


class ChatScreen(Screen[None]):
    def __init__(self, controller: ChatController, sources: Callable[[], Sources],
                 accept: Callable[[PromptInput.Submitted], None], help: Callable[[], None],
                 ready: Callable[[], None]) -> None:
        super().__init__()
        self.controller, self._sources, self._accept, self._help, self._ready = controller, sources, accept, help, ready

    def compose(self):
        yield Conversation()
        yield PromptInput(id="prompt", sources=self._sources)
        yield LoadProgress()
        yield StatusBar()
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._ready()  # the app's: the controller may draw now

    # ---- the View: its widgets ------------------------------------------------------------

    @property
    def conversation(self) -> Conversation:
        return self.query_one(Conversation)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def load_progress(self) -> LoadProgress:
        return self.query_one(LoadProgress)

    # ---- the View: the app's part ---------------------------------------------------------

    def say(self, message: str, severity: str = "information") -> None:
        """A notice that passes (a toast: a file exported, a model loaded), over the conversation."""
        self.app.notify(printable(message), severity=severity, markup=False,  # type: ignore[arg-type]
                        timeout=notice_seconds(message, severity))

    def note(self, message: str, severity: str = "information") -> None:
        """What a command says back (its output, or why it refused): a note in the conversation
        that stays and scrolls with it; never saved with the chat nor seen by the model."""
        self.conversation.add_system_note(message, severity)

    def titled(self, name: str) -> None:
        self.app.sub_title = name
        self.app.refresh_bindings()  # F2 is there only where the model's template has the switch

    def exit_app(self, code: int) -> None:
        self.app.exit(return_code=code)

    def show_chat_list(self, store: Any, chosen: Callable[[int | None], None]) -> None:
        self.app.push_screen(ChatList(store), chosen)

    def show_help(self) -> None:
        self._help()

    def in_thread(self, work: Callable[[], None], name: str) -> None:
        self.app.run_worker(work, thread=True, group="export", name=name)

    def from_thread(self, call: Callable[..., None], *args: Any) -> None:
        self.app.call_from_thread(call, *args)

    @property
    def themes(self) -> list[str]:
        return sorted(self.app.available_themes)

    @property
    def theme_name(self) -> str:
        return self.app.theme

    def use_theme(self, name: str) -> None:
        self.app.theme = name
