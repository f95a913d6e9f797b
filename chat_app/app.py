"""ChatApp: the Textual app around one chat: its keys, its one screen, and the thread between
the session's worker and the controller.

Layers (each imports only those below it; tests/test_imports.py checks there is no cycle):
- chat_app.controller.ChatController: the chat without its screen (no Textual): the store, the
  session, the one turn (chat_app.turn), and its parts, which share one ChatCore
  (chat_app.core) and never hold the App: model_switch (the first model, /model, a model
  process that ended), replies (a message and its reply), chats (--resume, the chat list),
  editing, versions, commands (the /commands).
- chat_app.screen.ChatScreen: the View the controller draws through (chat_app.view), and what
  the user does in its widgets, passed to the controller.
- this module: the bindings (each an action of the controller's; F3 a reply's thinking,
  chat_app.widgets.reply; every key passes the Ctrl+X Ctrl+E chord first, the message in
  $EDITOR: chat_app.external_editor), the palette
  (chat_app.palette), the help screen, signals, and the session's worker's events: the worker
  (chat_app.worker, a thread that owns the session and runs the jobs of chat_app.jobs) hands
  each event to `deliver`, which gathers them into a batch and posts ONE `SessionReported`
  message per batch; the batch is drawn at most DRAIN_HZ times a second (one Markdown update
  a batch, never one per token, nothing dropped), and nothing is drawn while the app shuts down.

A reply replaces what is on screen only once it has begun (`Started` follows the session's
first event), so a send or regenerate that fails before that changes nothing. A store that
cannot write is a notice (chat_app.saving): the chat stays in memory and on screen, the next
write retries (see chat_app.store), and at quit what chat.db still lacks goes to an
unsaved-*.md file that `farewell` names for main() to print. A streaming reply is saved as
partial at its first text and then at most once a second. An exception that escapes anyway is
kept in `crash` for main() to report (one line, traceback in the data folder's log). SIGTERM
and SIGHUP quit as Ctrl+Q does; `quit_signal` names the signal (main() exits with 128 + it).
This module never imports torch (of tinyllm only the torch-free chat_events and
session_protocol): __main__ passes a function that opens the session (a ModelProcess: a
RemoteSession, whose ChatSession runs in a child process; or a ServerSession, a server's
replies in this process: chat_app.server_session), called as
`open_session(progress=callback, **changes)` (changes: another path or server, for /model).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import events, on
from textual.app import App
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.worker import get_current_worker

from chat_app.commands import COMMANDS
from chat_app.controller import ChatController
from chat_app.external_editor import Chord, cut, edit_prompt
from chat_app.labels import printable
from chat_app.palette import PROVIDERS, completion_sources
from chat_app.reading import READING_KEYS, copy_or_hint, copy_reply, scroll
from chat_app.screen import ChatScreen
from chat_app.store import Resumed, Store, StoreError
from chat_app.terminal import driver_class
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.load_progress import LoadProgress
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.reply import thinking_target
from chat_app.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from tinyllm.session.session_protocol import ModelProcess

DRAIN_HZ = 30  # batches of the worker's events drawn per second, at most
WATCH_HZ = 4  # how often the controller looks at what the session does not report (a process that ended)

INPUT_KEYS = [("Enter", "send the message (or run a /command)"),
              ("Shift+Enter, Ctrl+J", "new line in the message (Ctrl+J also works in tmux)"),
              ("Up (empty prompt)", "edit your last message: Enter replaces it and its reply (the old turn "
               "stays, a version: Ctrl+Left shows it), Esc cancels"),
              ("Up / Down", "earlier prompts (Up on the first line, Down on the last; from an empty prompt "
               "the first Up edits, the next ones recall)"),
              ("Ctrl+Left / Ctrl+Right", "(empty prompt) the last reply's earlier / later version (Ctrl+R and "
               "edits keep the one they replace; the border says \u2039 2/3 \u203a)"),
              ("Ctrl+X Ctrl+E", "write the message in $VISUAL / $EDITOR (else vi): what you save comes back")]


def key_name(key: str) -> str:
    return "+".join(part.upper() if len(part) == 1 else part.capitalize() for part in key.split("+"))


class SessionReported(Message):
    """The session's worker has events for the controller: one message per batch (`events`
    grows until the batch is drawn)."""

    def __init__(self, events: list[object]) -> None:
        super().__init__()
        self.events = events


class ChatApp(App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "tinyllm-chat"
    ENABLE_COMMAND_PALETTE = True  # Ctrl+P: Textual's palette over chat_app.palette's providers
    COMMANDS = set(PROVIDERS)
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply (its text stays, marked stopped)"),
        Binding("ctrl+r", "regenerate", "Regen", tooltip="a new version of the last reply (the old one stays: "
                "Ctrl+Left; a new seed; a greedy chat samples at regen_temperature)"),
        Binding("ctrl+f", "continue", "More", tooltip="continue the last reply where it ended (/continue)"),
        Binding("ctrl+n", "new_chat", "New", tooltip="start a new chat (the old one stays saved)"),
        Binding("ctrl+o", "chats", "Chats", tooltip="saved chats: open, rename (r), delete (d)"),
        Binding("ctrl+p", "command_palette", "Commands", show=False, priority=True, tooltip="command "
                "palette: commands, settings, themes, chats, models"),
        Binding("ctrl+t", "copy_reply", "Copy reply", show=False, tooltip="copy the last reply (Markdown source)"),
        Binding("ctrl+g", "toggle_graphs", "Fast", tooltip="the fast step on/off from the next step, "
                "mid-reply too: CUDA graphs on a GPU, the native C++ step on a CPU"),
        Binding("f2", "toggle_thinking", "Think", tooltip="thinking on/off from the next reply (/set thinking "
                "on|off): the chat template's own switch, enable_thinking (Qwen 3); only where it has one"),
        Binding("f3", "toggle_thought", "Thought", show=False, tooltip="open or fold a reply's thinking (the "
                "picked reply's, else the last one's; a click on its line too)"),
        Binding("f1", "help", "Help", tooltip="this help"),
        Binding("ctrl+q", "quit", "Quit", tooltip="quit", priority=True),
        Binding("ctrl+c", "help_quit", "Copy", show=False, tooltip="copy the selection or what is picked "
                "(never quits)"),
    ]

    def __init__(self, open_session: Callable[..., ModelProcess], store: Store, model_name: str = "model",
                 resume: Resumed | None = None, theme: str | None = None, fallback: str | None = None,
                 servers: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(driver_class=driver_class())
        self.chosen_theme = theme
        self.resume = resume
        self.crash: BaseException | None = None  # an exception nothing else caught (main() reports it)
        self.quit_signal: int | None = None  # the signal that ended the app (SIGTERM, SIGHUP)
        self.farewell: str | None = None  # one line for main() to print after the app ends (an unsaved chat)
        self.controller = ChatController(open_session, store, self._spawn, self._deliver, model_name, servers)
        self.controller.models.fallback = fallback  # --resume opened the chat's model: the one to open if refused
        self._batch: list[object] = []  # the worker's events not yet drawn
        self._batch_lock = threading.Lock()
        self._drawn_at = 0.0
        self.chord = Chord()  # Ctrl+X Ctrl+E: the message in $EDITOR (chat_app.external_editor)

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen(self.controller, lambda: completion_sources(self), self.accept, self.action_help,
                          self._screen_ready)

    # ---- what the tests and main() read -----------------------------------------------------

    @property
    def chat_screen(self) -> ChatScreen:
        return self.screen_stack[0]  # type: ignore[return-value]

    @property
    def session(self) -> ModelProcess | None:
        """The model that answers (None while one opens: chat_app.model_switch)."""
        return self.controller.session

    @property
    def store(self) -> Store:
        return self.controller.core.store

    @property
    def servers(self) -> dict[str, dict[str, Any]]:
        return self.controller.core.servers

    @property
    def model_name(self) -> str:
        return self.controller.core.model_name

    @property
    def open_session(self) -> Callable[..., ModelProcess]:
        """What opens a session (the worker calls it); tests put a held or failing one here."""
        return self.controller.core.worker.open_session

    @open_session.setter
    def open_session(self, opener: Callable[..., ModelProcess]) -> None:
        self.controller.core.worker.open_session = opener

    @property
    def busy(self) -> bool:
        """A send, regenerate, edit or continue is queued or running."""
        return self.controller.busy

    @property
    def bad_input(self) -> str | None:
        """Why the first model was refused (main() prints it, exit code 2)."""
        return self.controller.core.bad_input

    @property
    def load_progress(self) -> LoadProgress:
        return self.chat_screen.load_progress

    @property
    def conversation(self) -> Conversation:
        return self.chat_screen.conversation

    @property
    def prompt(self) -> PromptInput:
        return self.chat_screen.prompt

    @property
    def status(self) -> StatusBar:
        return self.chat_screen.status

    def say(self, message: str, severity: str = "information") -> None:
        self.chat_screen.say(message, severity)

    # ---- the session's worker ---------------------------------------------------------------

    def _spawn(self, serve: Callable[[Callable[[], bool]], None]) -> None:
        """The worker's thread: Textual's thread worker "session" (exclusive: a new one replaces
        the last), cancelled as the app ends."""
        def run() -> None:
            worker = get_current_worker()
            serve(lambda: worker.is_cancelled)

        self.run_worker(run, thread=True, exclusive=True, group="session", name="session")

    def _deliver(self, event: object) -> None:
        """An event of the worker's (any thread): into the batch; the batch's first posts it."""
        with self._batch_lock:
            self._batch.append(event)
            if len(self._batch) > 1:
                return
            batch = self._batch
        self.post_message(SessionReported(batch))

    @on(SessionReported)
    def reported(self, message: SessionReported) -> None:
        wait = self._drawn_at + 1 / DRAIN_HZ - time.monotonic()
        if wait > 0:  # more of the batch comes meanwhile: one Markdown update for all of it
            self.set_timer(wait, lambda: self._draw(message.events))
        else:
            self.call_next(self._draw, message.events)

    async def _draw(self, events: list[object]) -> None:
        with self._batch_lock:
            if self._batch is events:
                self._batch = []  # the next event starts another batch
        self._drawn_at = time.monotonic()
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        try:
            await self.controller.handle(events)
        except NoMatches:  # only shutting down removes the app's widgets: nothing left to show
            return

    def _watch(self) -> None:
        if self.is_running:
            try:
                self.controller.watch()
            except NoMatches:
                return

    # ---- start and end ------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self._catch_signals(True)
        self.app_resume_signal.subscribe(self, self._redraw)
        if self.chosen_theme:
            self.theme = self.chosen_theme

    def _screen_ready(self) -> None:
        """The chat screen has its widgets (ChatScreen.on_mount): the controller may draw."""
        try:
            self.prompt.prompts = [printable(p) for p in self.store.prompts()]  # Up recalls earlier runs' too
        except StoreError:
            pass  # said at start (store.error)
        self.controller.attach(self.chat_screen)
        self.prompt.last_message = self.controller.editor.last_message  # what Up in an empty prompt edits
        self.prompt.focus()
        self.set_interval(1 / WATCH_HZ, self._watch)
        self.call_after_refresh(self._start)  # the first frame first: the child competes for the CPU

    async def _start(self) -> None:
        showing = self.controller.start(self.resume)
        if showing is not None:
            await showing

    def _catch_signals(self, on: bool) -> None:
        """SIGTERM and SIGHUP quit as Ctrl+Q does (the terminal restored, what streamed saved);
        main() then exits with 128 + the signal's number. Where the loop cannot (not the main
        thread, Windows), they keep their default."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            try:
                if on:
                    loop.add_signal_handler(sig, self._quit_on, sig)
                else:
                    loop.remove_signal_handler(sig)
            except (TypeError, ValueError, RuntimeError, NotImplementedError):
                pass

    def _redraw(self, _app: App) -> None:
        """Back from Ctrl+Z / SIGTSTP (SIGCONT): Textual enters a new, blank alternate screen and
        draws only what changed, which left 27 of 30 rows blank until a key. The whole screen
        is marked dirty, so the next frame draws every row."""
        self.screen.refresh(self.screen.region)

    def _quit_on(self, sig: int) -> None:
        self.quit_signal = sig
        self.exit(return_code=128 + sig)

    def on_unmount(self) -> None:
        self._catch_signals(False)
        self.farewell = self.controller.quit()

    def _handle_exception(self, error: Exception) -> None:
        """Textual's hook for an exception no handler caught: the app exits with code 1.
        Kept for main(), which writes one line and the traceback to the log."""
        self.crash = error
        super()._handle_exception(error)
        self._exit_renderables.clear()  # no traceback over the terminal: main() reports it

    # ---- the input and the keys ---------------------------------------------------------------

    def accept(self, event: PromptInput.Submitted) -> None:
        """The input gives up the submitted text, which joins the prompt history."""
        if self.prompt.accept(event):
            self.controller.core.save(self.store.add_prompt, event.text)

    async def run_command(self, text: str) -> None:
        """A /command line, as if typed (chat_app.commands; the palette's)."""
        await self.controller.run_command(text)

    @on(PromptInput.Submitted)
    async def submitted(self, event: PromptInput.Submitted) -> None:
        await self.controller.submitted(event.text, event.replaces, lambda: self.accept(event))

    @on(PromptInput.Scrolled)
    def scrolled(self, event: PromptInput.Scrolled) -> None:
        scroll(self.conversation, event.key)

    @on(PromptInput.Versions)
    async def last_versions(self, event: PromptInput.Versions) -> None:
        await self.controller.step_versions(None, event.step)

    @on(Conversation.Versions)
    async def picked_versions(self, event: Conversation.Versions) -> None:
        saved = getattr(event.widget, "saved", None)
        if saved is None:
            self.say("This message has no other versions.")
        else:
            await self.controller.step_versions(saved, event.step)

    def action_stop(self) -> None:
        self.controller.stop()

    def action_regenerate(self) -> None:
        self.controller.regenerate()

    def action_continue(self) -> None:
        self.controller.continue_reply()

    def action_new_chat(self) -> None:
        self.controller.new_chat()

    def action_toggle_graphs(self) -> None:
        self.controller.toggle_graphs()

    def action_toggle_thinking(self) -> None:
        self.controller.toggle_thinking()

    def action_chats(self) -> None:
        self.controller.chats.show_list()

    def copy_to_clipboard(self, text: str) -> None:
        """Every copy (Ctrl+T, C on a picked message or code block, Ctrl+C on a selection) goes
        out with its control characters made visible (chat_app.labels: the rule for what the app
        writes out, docs/RELIABILITY.md): a copied message that held OSC 52 or CSI 2J pasted
        into a terminal would act on it."""
        super().copy_to_clipboard(printable(text))

    def action_copy_reply(self) -> None:
        copy_reply(self.conversation, self.copy_to_clipboard, self.say)

    def action_help_quit(self) -> None:
        copy_or_hint(self.conversation, self.say)

    # ---- a reply's thinking (F3) and the message in $EDITOR (Ctrl+X Ctrl+E) -------------------

    def action_toggle_thought(self) -> None:
        reply = thinking_target(self.conversation.query("Reply"), self.conversation.picked)
        if reply is None:
            self.say("No reply here has thinking to open.")
        else:
            reply.toggle_thought()

    def action_external_editor(self) -> None:
        edit_prompt(self)

    async def on_event(self, event: events.Event) -> None:
        """Every key passes the Ctrl+X Ctrl+E chord first (chat_app.external_editor.Chord)."""
        if isinstance(event, events.Key) and not event.is_forwarded:
            what = self.chord.key(event.key, over_chat=len(self.screen_stack) == 1 and self.is_running)
            if what == "wait":
                return
            if what == "edit":
                self.action_external_editor()
                return
            if what == "replay":  # Ctrl+X held back: its cut now, before the key after it
                cut(self.focused)
        await super().on_event(event)

    def _has_thinking(self) -> bool:
        if self.session is not None and getattr(self.session, "thinking", None) is not None:
            return True
        try:
            return thinking_target(self.conversation.query("Reply")) is not None
        except NoMatches:
            return False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The palette opens over the chat only, where what it chooses acts (not over F1 or the
        chat list); F2 (thinking) is there only where the model's template has the switch, F3
        (a reply's thinking) there and where a reply has thinking."""
        if action == "toggle_thinking":
            return self.session is not None and getattr(self.session, "thinking", None) is not None
        if action == "toggle_thought":
            return self._has_thinking()
        return action != "command_palette" or len(self.screen_stack) == 1

    def action_help(self) -> None:
        keys = INPUT_KEYS + READING_KEYS + [(key_name(b.key), b.tooltip) for b in self.BINDINGS
                                            if isinstance(b, Binding) and self.check_action(b.action, ())]
        commands = [(f"/{name} {args}".rstrip(), does) for name, (args, does) in COMMANDS.items()]
        model, about = self.controller.about()
        self.push_screen(HelpScreen(keys, commands, model, about))
