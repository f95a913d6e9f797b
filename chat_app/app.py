"""ChatApp: the Textual app around one session: its widgets, bindings and actions, and the
parts it is made of, each owning its own state.

Parts (each a plain object holding the app, called through its public methods):
- `session_worker` (chat_app.worker.SessionWorker): the ONE long-lived worker thread that opens
  the session (a progress bar meanwhile) and then owns it, running the jobs the UI queues in
  order; everything it learns comes back as typed events (chat_app.events) in its outbox.
- `drawer` (chat_app.drawing.Drawer): a timer drains that outbox at most 30 times a second
  (one Markdown update per drained batch, never one per token, nothing dropped) and sends each
  event to its owner; it owns the reply in flight and `busy`.
- `models` (chat_app.model_switch.ModelSwitcher): owns the open session; the first load,
  /model, a saved chat's own model, a model process that ended, a message sent while loading.
- `chats` (chat_app.chats.ChatSwitcher): --resume, the chat list, showing a saved chat.
- `commands` (chat_app.commands.CommandRunner): the /commands.
- `reader` (chat_app.reading.Reader): keys for reading and copying.
- `editor` (chat_app.editing.Editor): Up in an empty prompt edits the last message.
- `versions` (chat_app.versions.VersionSwitcher): the versions Ctrl+R and edits keep; /edits.
- `saver` (chat_app.saving.StoreWriter): every store write, and its failures as notices.
From the UI thread only the session's thread-safe calls are made directly: stop(),
set_graphs(), set_param().

Policy: a message (an edit, Ctrl+R) while a reply runs is refused with a notice and the typed
text stays in the input; Ctrl+N and /clear stop the running reply first, /system waits for it.
A message sent while the first model loads waits for it instead (chat_app.model_switch).
A reply replaces what is on screen only once it has begun (`Started` follows the session's
first event), so a send or regenerate that fails before that changes nothing. Errors are
caught once, in the worker, shown with notify(severity="error") (a command's refusal, /system's
too, is a note in the conversation instead: chat_app.commands), and the conversation is
kept. A store that cannot write is a notice too (chat_app.saving): the chat stays in memory
and on screen, the next write retries (see chat_app.store), and at quit what chat.db still lacks
goes to an unsaved-*.md file that `farewell` names for main() to print. A streaming reply is
saved as partial at its first text and then at most once a second. An exception that escapes
anyway is kept in `crash` for main() to report (one line, traceback in the data folder's log).
SIGTERM and SIGHUP quit as Ctrl+Q does; `quit_signal` names the signal (main() exits with
128 + it). This module never imports torch (of tinyllm only the torch-free chat_events and
session_protocol): __main__ passes a function that opens the session (a ModelProcess: a
RemoteSession, whose ChatSession runs in a child process; or a ServerSession, a server's
replies in this process: chat_app.server_session), called as
`open_session(progress=callback, **changes)` (changes: another path or server, for /model).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import App
from textual.binding import Binding
from textual.widgets import Footer

from chat_app.chats import ChatSwitcher
from chat_app.commands import COMMANDS, CommandRunner
from chat_app.drawing import DRAIN_HZ, Drawer
from chat_app.editing import Editor
from chat_app.labels import printable
from chat_app.model_switch import ModelSwitcher
from chat_app.palette import PROVIDERS, completion_sources
from chat_app.reading import READING_KEYS, Reader
from chat_app.saving import StoreWriter
from chat_app.store import Resumed, Store, StoreError
from chat_app.terminal import driver_class
from chat_app.versions import VersionSwitcher
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.load_progress import LoadProgress
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.status_bar import StatusBar
from chat_app.worker import SessionWorker

if TYPE_CHECKING:
    from tinyllm.session.session_protocol import ModelProcess

INPUT_KEYS = [("Enter", "send the message (or run a /command)"),
              ("Shift+Enter, Ctrl+J", "new line in the message (Ctrl+J also works in tmux)"),
              ("Up (empty prompt)", "edit your last message: Enter replaces it and its reply (the old turn "
               "stays, a version: Ctrl+Left shows it), Esc cancels"),
              ("Up / Down", "earlier prompts (Up on the first line, Down on the last; from an empty prompt "
               "the first Up edits, the next ones recall)"),
              ("Ctrl+Left / Ctrl+Right", "(empty prompt) the last reply's earlier / later version (Ctrl+R and "
               "edits keep the one they replace; the border says \u2039 2/3 \u203a)")]


def key_name(key: str) -> str:
    return "+".join(part.upper() if len(part) == 1 else part.capitalize() for part in key.split("+"))


def notice_seconds(message: str, severity: str = "information") -> float:
    """How long a notice stays: 2 s and about 4 words a second for information, at most 6 s;
    a warning or an error 8 s (what went wrong is worth the time)."""
    if severity != "information":
        return 8.0
    return min(6.0, 2.0 + len(message.split()) / 4)


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
        self.servers = servers or {}  # config.toml's [servers]: names /model and the palette offer
        self.store, self.model_name, self.resume = store, model_name, resume
        self.crash: BaseException | None = None  # an exception nothing else caught (main() reports it)
        self.quit_signal: int | None = None  # the signal that ended the app (SIGTERM, SIGHUP)
        self.farewell: str | None = None  # one line for main() to print after the app ends (an unsaved chat)
        self._regen_told: object = None  # the store's chat that Ctrl+R's greedy notice was shown for
        self.session_worker = SessionWorker(self, open_session)
        self.saver = StoreWriter(store, self.say)
        self.drawer = Drawer(self)
        self.models = ModelSwitcher(self)
        self.models.fallback = fallback  # --resume opened the chat's model: the one to open if it is refused
        self.chats = ChatSwitcher(self)
        self.commands = CommandRunner(self)
        self.reader = Reader(self)
        self.editor = Editor(self)
        self.versions = VersionSwitcher(self)

    def compose(self):
        yield Conversation()
        yield PromptInput(id="prompt", sources=lambda: completion_sources(self))
        yield LoadProgress()
        yield StatusBar()
        yield Footer(compact=True)

    @property
    def session(self) -> ModelProcess | None:
        """The model that answers (None while one opens: chat_app.model_switch)."""
        return self.models.session

    @property
    def open_session(self) -> Callable[..., ModelProcess]:
        """What opens a session (the worker calls it); tests put a held or failing one here."""
        return self.session_worker.open_session

    @open_session.setter
    def open_session(self, opener: Callable[..., ModelProcess]) -> None:
        self.session_worker.open_session = opener

    @property
    def busy(self) -> bool:
        """A send, regenerate or continue is queued or running."""
        return self.drawer.busy

    @property
    def bad_input(self) -> str | None:
        """Why the first model was refused (main() prints it, exit code 2)."""
        return self.models.bad_input

    @property
    def load_progress(self) -> LoadProgress:
        return self.query_one(LoadProgress)

    @property
    def conversation(self) -> Conversation:
        return self.query_one(Conversation)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    async def on_mount(self) -> None:
        self._catch_signals(True)
        self.app_resume_signal.subscribe(self, self._redraw)
        if self.chosen_theme:
            self.theme = self.chosen_theme
        try:
            self.prompt.prompts = [printable(p) for p in self.store.prompts()]  # Up recalls earlier runs' too
        except StoreError:
            pass  # said below (store.error)
        self.models.show_loading(self.model_name)
        self.prompt.last_message = self.editor.last_message  # what Up in an empty prompt edits
        self.prompt.focus()
        self.set_interval(1 / DRAIN_HZ, self.drawer.drain)
        self.call_after_refresh(self.session_worker.start)  # the first frame first: the child competes for the CPU
        if self.store.error:
            self.saver.failed(self.store.error)
        self.saver.notices()
        if self.resume is not None:  # what --resume found (Store.resume, in main())
            await self.chats.resume_last_chat(self.resume)

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
        self.drawer.save_partial()  # quitting mid-reply keeps what streamed (still marked partial)
        self.farewell = self.store.rescue()  # what chat.db still lacks goes to an unsaved-*.md file
        self.store.close()  # the conversation is free for the next instance
        if self.session is not None:  # the worker, even one waiting on a reply, ends now (it closes it too)
            self.session.close()

    def say(self, message: str, severity: str = "information") -> None:
        """A notice that passes (a toast: a file exported, a model loaded). It may echo a model's
        name, a path, what was typed: plain text (chat_app.labels). It stays as long as it takes
        to read (`notice_seconds`), not Textual's 5 s for every notice, over the conversation."""
        self.notify(printable(message), severity=severity, markup=False,  # type: ignore[arg-type]
                    timeout=notice_seconds(message, severity))

    def note(self, message: str, severity: str = "information") -> None:
        """What a command says back (its output, or why it refused): a note in the conversation
        that stays and scrolls with it; never saved with the chat nor seen by the model."""
        self.conversation.add_system_note(message, severity)

    def queue_job(self, kind: str, arg: Any) -> None:
        """A job for the session's worker (chat_app.worker); a model process that ended is
        started again first (not for another model, which replaces the process anyway)."""
        if kind != "model":
            self.models.restart_if_ended()
        self.session_worker.put(kind, arg)

    def save(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """One store write (chat_app.saving): a failure is a notice, never a crash."""
        self.saver.save(write, *args, **kwargs)

    def _handle_exception(self, error: Exception) -> None:
        """Textual's hook for an exception no handler caught: the app exits with code 1.
        Kept for main(), which writes one line and the traceback to the log."""
        self.crash = error
        super()._handle_exception(error)
        self._exit_renderables.clear()  # no traceback over the terminal: main() reports it

    # ---- input --------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text
        self.saver.user_acted()
        if text.startswith("/"):
            self.accept(event)
            await self.commands.run(text)
        elif event.replaces is not None:  # an edit of the last message (chat_app.editing)
            self.editor.send_edit(event)
        elif self.models.loading_first:  # it waits for the model (chat_app.model_switch)
            await self.models.send_when_loaded(event)
        elif self.ready_for_reply():
            self.drawer.ask(text)  # in the chat before anything else happens to it (chat_app.drawing)
            self.accept(event)
            await self.drawer.send(text)

    def accept(self, event: PromptInput.Submitted) -> None:
        """The input gives up the submitted text, which joins the prompt history."""
        if self.prompt.accept(event):
            self.save(self.store.add_prompt, event.text)

    async def run_command(self, text: str) -> None:
        """A /command line, as if typed (chat_app.commands)."""
        await self.commands.run(text)

    def ready_for_reply(self) -> bool:
        """A model is open and no reply runs; else a notice says which, and False."""
        if self.session is None:
            self.say("The model is still loading (or failed to load).", "warning")
        elif self.busy:
            self.say("A reply is still running: wait for it, or press Esc to stop it.", "warning")
        else:
            return True
        return False

    @on(PromptInput.Scrolled)
    def scrolled(self, event: PromptInput.Scrolled) -> None:
        self.reader.scroll(event.key)

    @on(PromptInput.Versions)
    async def last_versions(self, event: PromptInput.Versions) -> None:
        await self.versions.step_last(event.step)

    @on(Conversation.Versions)
    async def picked_versions(self, event: Conversation.Versions) -> None:
        saved = getattr(event.widget, "saved", None)
        if saved is None:
            self.say("This message has no other versions.")
        else:
            await self.versions.step(saved, event.step)

    def action_stop(self) -> None:
        self.drawer.stop()

    def action_regenerate(self) -> None:
        """Ctrl+R: the last reply written again, as a new sample (SamplingParams.regenerating: a
        fresh seed; a greedy chat samples at regen_temperature, and says so once per chat). The
        chat's settings stay for its next message. A last user turn with no reply (a resumed
        chat) gets its reply with the chat's own settings."""
        self.saver.user_acted()
        if not self.ready_for_reply():
            return
        s = self.session
        assert s is not None
        if not (s.messages and s.messages[-1].role == "assistant"):
            self.drawer.begin("regenerate", None)
            return
        self.drawer.begin("regenerate", s.params.regenerating(secrets.randbits(63)))
        if s.params.greedy and self._regen_told is not self.store.chat:
            self._regen_told = self.store.chat  # once per chat (Ctrl+N and opening a chat make another)
            t = s.params.regen_temperature
            self.say(f"The chat is greedy: Ctrl+R samples at temperature {t}; /set regen_temperature to change."
                     if t else "The chat is greedy and regen_temperature is 0: Ctrl+R writes the same reply "
                     "again; /set regen_temperature 0.8 to sample a new one.")

    def action_continue(self) -> None:
        self.saver.user_acted()
        if self.session is not None and not (self.session.messages and self.session.messages[-1].role == "assistant"):
            self.say("No reply to continue yet.", "warning")
        elif self.ready_for_reply():
            self.drawer.begin("continue_reply", None)

    def action_new_chat(self) -> None:
        self.action_stop()
        self.queue_job("new_chat", None)

    def action_toggle_graphs(self) -> None:
        """Ctrl+G: the fast step on/off (ChatSession.set_graphs): CUDA graphs on a GPU, the
        native C++ step against the plain step run eagerly on a CPU. Where a CPU session runs
        no native step (--compile off or inductor, a model it cannot run), a notice says so."""
        s = self.session
        if s is None:
            self.say("The model is still loading.", "warning")
        elif s.step_kind == "remote":
            self.say("Ctrl+G does not apply here: the server decodes, with its own settings.", "warning")
        elif s.graphs_available:
            s.set_graphs(not s.use_graph)
            self.status.show(graphs=s.use_graph)
            self.say(f"CUDA graphs {'ON' if s.use_graph else 'OFF'} from the next step.")
        elif s.step_kind in ("native", "eager"):
            try:
                s.set_graphs(not s.use_graph)
            except ValueError as e:
                self.say(f"Could not switch the step: {e}", "error")
                return
            self.status.show(step=s.step_kind)
            self.say("The native CPU step from the next step." if s.use_graph else
                     "The plain step, run eagerly, from the next step (Ctrl+G: the native step again).")
        else:
            why = ("it was started with --compile off" if s.step_kind == "plain" else
                   "--compile inductor, or a model the native C++ step cannot run")
            self.say(f"No fast step to switch here: this CPU session has no native C++ step ({why}); "
                     "--compile on runs it where the model allows.", "warning")

    def action_toggle_thinking(self) -> None:
        """F2: the chat template's thinking switch the other way (as /set thinking does)."""
        self.commands.switch_thinking(None, self.say)

    def action_chats(self) -> None:
        self.chats.show_list()

    def action_copy_reply(self) -> None:
        self.reader.copy_reply()

    def action_help_quit(self) -> None:
        self.reader.copy_or_hint()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The palette opens over the chat only, where what it chooses acts (not over F1 or the
        chat list); F2 (thinking) is there only where the model's template has the switch."""
        if action == "toggle_thinking":
            return self.session is not None and getattr(self.session, "thinking", None) is not None
        return action != "command_palette" or len(self.screen_stack) == 1

    def action_help(self) -> None:
        keys = INPUT_KEYS + READING_KEYS + [(key_name(b.key), b.tooltip) for b in self.BINDINGS
                                            if isinstance(b, Binding) and self.check_action(b.action, ())]
        commands = [(f"/{name} {args}".rstrip(), does) for name, (args, does) in COMMANDS.items()]
        s = self.session
        model = f"{s.name} ({s.family})" if s is not None and getattr(s, "family", "") else ""
        about = ""
        if s is not None and s.step_kind == "remote":  # a server's context is its own (max_len 0)
            about = f"Served by {s.path}: its context, sampling and speed are the server's."
        elif s is not None:
            note = getattr(s, "context_note", "")
            about = f"Context: {s.max_len:,} positions" + (f"; {note}." if note else ", the model's own.")
        self.push_screen(HelpScreen(keys, commands, model, about))
