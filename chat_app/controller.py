"""ChatController: the chat without its screen. It owns the state (chat_app.core: the store,
the session, the one turn) and the parts that change it, and it is what the screen calls.

Contract: the screen (chat_app.screen, a `View`) calls in with what the user did
(`submitted`, `stop`, `regenerate`, `toggle_graphs`, ...) and the app with what the session's
worker reported, a batch at a time (`handle(events)`: the Token texts of one batch are ONE
Markdown update, nothing dropped); every other event goes to the part that owns it: Loaded and
a model's failure to the model switcher (chat_app.model_switch), a reply's events to
chat_app.replies, an OpenChat barrier to the chat switcher (chat_app.chats), the load's
Progress to the load bar. `watch()` runs a few times a second, for what the session does not
report as an event: a model process that ended while no reply ran, a step kind that changed
between replies (a compile ended), a streaming reply's periodic save.

Policy: a message (an edit, Ctrl+R) while a reply runs is refused with a notice and the typed
text stays in the input; Ctrl+N and /clear stop the running reply first, /system waits for it.
A message sent while the first model loads waits for it instead (chat_app.model_switch).
Errors are caught once, in the worker, and shown as notices (a command's refusal, /system's
too, is a note in the conversation instead: chat_app.commands); the conversation is kept.
From the UI thread only the session's thread-safe calls are made directly: stop(),
set_graphs(), set_param(), set_thinking(). Imports neither Textual nor torch: tested with a
view of plain objects (tests/chat_app/test_controller.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chat_app.chats import ChatSwitcher
from chat_app.commands import CommandRunner
from chat_app.core import ChatCore
from chat_app.editing import Editor
from chat_app.events import Done, Failed, Finished, Loaded, LoadFailed, Prefilled, Progress, Started, Token
from chat_app.jobs import LoadMessages, NewChat, OpenChat, Params, Restart, SetSystem, SwitchModel
from chat_app.model_switch import ModelSwitcher
from chat_app.replies import Replies
from chat_app.showing import system_note
from chat_app.versions import VersionSwitcher
from chat_app.worker import SessionWorker, Spawn

if TYPE_CHECKING:
    from chat_app.store import Resumed, Saved, Store
    from chat_app.view import View
    from tinyllm.session.session_protocol import ModelProcess


def echo(text: str, width: int = 100) -> str:
    """Text a notice repeats back: its first line, at most `width` characters (a notice holding a
    whole long system prompt covered the screen)."""
    line = text.strip().split("\n", 1)[0]
    if line == text.strip() and len(line) <= width:
        return line
    return f"{line[:width - 1].rstrip()}… ({len(text):,} characters)"


class ChatController:
    def __init__(self, open_session: Callable[..., ModelProcess], store: Store, spawn: Spawn,
                 deliver: Callable[[object], None], model_name: str = "model",
                 servers: dict[str, dict[str, Any]] | None = None) -> None:
        worker = SessionWorker(open_session, spawn, deliver)
        self.core = core = ChatCore(store, worker, model_name, servers or {})
        self.models = ModelSwitcher(core)
        self.editor = Editor(core)
        self.replies = Replies(core, self.editor)
        self.chats = ChatSwitcher(core, self.models)
        self.versions = VersionSwitcher(core)
        self.commands = CommandRunner(core, self.models, self.chats, self.versions, self.replies)

    @property
    def session(self) -> ModelProcess | None:
        return self.core.session

    @property
    def busy(self) -> bool:
        return self.core.busy

    # ---- start and end ---------------------------------------------------------------------

    def attach(self, view: View) -> None:
        """The screen is there: the load bar shows the model opening."""
        self.core.view = view
        self.core.show_loading(self.core.model_name)

    def start(self, resume: Resumed | None) -> Any:
        """Open the first model (on the worker); what --resume found, shown (a coroutine)."""
        core = self.core
        core.worker.start()
        if core.store.error:
            core.saver.failed(core.store.error)
        core.saver.notices()
        return self.chats.resume_last_chat(resume) if resume is not None else None

    def quit(self) -> str | None:
        """The app ends: what streamed is saved (still marked partial), what chat.db still lacks
        goes to an unsaved-*.md file (its line for main() to print, or None), the store is
        closed and the session with it."""
        self.replies.save_partial()
        farewell = self.core.store.rescue()
        self.core.store.close()
        if self.core.session is not None:  # the worker, even one waiting on a reply, ends now (it closes it too)
            self.core.session.close()
        return farewell

    # ---- what the user does ----------------------------------------------------------------

    async def submitted(self, text: str, replaces: str | None, accept: Callable[[], None]) -> None:
        """Enter in the input: a /command, an edit, or a message (`accept()`: the input gives
        the text up and keeps it in its history)."""
        core = self.core
        core.saver.user_acted()
        if text.startswith("/"):
            accept()
            await self.commands.run(text)
        elif replaces is not None:  # an edit of the last message (chat_app.editing)
            self.editor.send_edit(text, replaces, accept)
        elif self.models.loading_first:  # it waits for the model (chat_app.model_switch)
            await self.models.send_when_loaded(text, self.replies.ask, accept)
        elif core.ready_for_reply():
            self.replies.ask(text)  # in the chat before anything else happens to it (chat_app.replies)
            accept()
            await self.replies.send(text)

    async def run_command(self, text: str) -> None:
        """A /command line, as if typed (chat_app.commands)."""
        self.core.saver.user_acted()
        await self.commands.run(text)

    def stop(self) -> None:
        self.core.stop_reply()

    def new_chat(self) -> None:
        self.core.new_chat()

    def regenerate(self) -> None:
        self.replies.regenerate()

    def continue_reply(self) -> None:
        self.replies.continue_reply()

    def toggle_thinking(self) -> None:
        """F2: the chat template's thinking switch the other way (as /set thinking does)."""
        self.commands.switch_thinking(None, self.core.say)

    async def step_versions(self, saved: Saved | None, step: int) -> None:
        """A picked message's other version (None: the last reply's, else your last message's)."""
        if saved is None:
            await self.versions.step_last(step)
        else:
            await self.versions.step(saved, step)

    def toggle_graphs(self) -> None:
        """Ctrl+G: the fast step on/off (ChatSession.set_graphs): CUDA graphs on a GPU, the
        native C++ step against the plain step run eagerly on a CPU. Where a CPU session runs
        no native step (--compile off or inductor, a model it cannot run), a notice says so."""
        core = self.core
        s = core.session
        if s is None:
            core.say("The model is still loading.", "warning")
        elif s.capabilities.served:
            core.say("Ctrl+G does not apply here: the server decodes, with its own settings.", "warning")
        elif s.capabilities.graphs:
            s.set_graphs(not s.use_graph)
            core.view.status.show(graphs=s.use_graph)
            core.say(f"CUDA graphs {'ON' if s.use_graph else 'OFF'} from the next step.")
        elif s.step_kind in ("native", "eager"):
            try:
                s.set_graphs(not s.use_graph)
            except ValueError as e:
                core.say(f"Could not switch the step: {e}", "error")
                return
            core.view.status.show(step=s.step_kind)
            core.say("The native CPU step from the next step." if s.use_graph else
                     "The plain step, run eagerly, from the next step (Ctrl+G: the native step again).")
        else:
            why = ("it was started with --compile off" if s.step_kind == "plain" else
                   "--compile inductor, or a model the native C++ step cannot run")
            core.say(f"No fast step to switch here: this CPU session has no native C++ step ({why}); "
                     "--compile on runs it where the model allows.", "warning")

    def about(self) -> tuple[str, str]:
        """The help screen's lines on the model: its name and family, and its context."""
        s = self.core.session
        if s is None:
            return "", ""
        model = f"{s.name} ({s.family})" if getattr(s, "family", "") else ""
        if s.capabilities.served:  # a server's context is its own
            return model, f"Served by {s.path}: its context, sampling and speed are the server's."
        note = getattr(s, "context_note", "")
        return model, f"Context: {s.max_len:,} positions" + (f"; {note}." if note else ", the model's own.")

    # ---- what the worker reports -----------------------------------------------------------

    async def handle(self, batch: list[object]) -> None:
        """One batch of the worker's events, in order."""
        pieces: list[str] = []
        live = None
        for item in batch:
            if isinstance(item, Token):
                pieces.append(item.text)
                live = item.stats
                continue
            await self.replies.write(pieces)
            pieces = []
            await self._route(item)
            if isinstance(item, Finished):
                live = None
        await self.replies.write(pieces)
        if live is not None:
            self.core.show_stats(live, "generating")
        self.watch()

    def watch(self) -> None:
        """What the session does not send as an event, checked after each batch and a few times a second."""
        core = self.core
        s = core.session
        self.models.say_if_ended()
        if s is not None and not core.busy and core.view.status.fields.get("step") != s.step_kind:
            core.view.status.show(step=s.step_kind)  # a compile ended between replies: say so now
        self.replies.tick()

    async def _route(self, item: object) -> None:
        view = self.core.view
        match item:
            case Finished():
                await self.replies.finished(item)
            case Prefilled():
                self.replies.prefilled(item)
            case Started():
                await self.replies.started(item)
            case Loaded(session=s, switched=switched, keep_chat=keep_chat):
                await self.models.loaded(s, switched, keep_chat)
            case Progress(step="tensors", done=done, total=total):
                view.load_progress.advance(done, total)
            case Progress(step=step, done=done, total=total, seconds=seconds, compiling=compiling):
                view.load_progress.kernels(step, done, total, seconds, compiling)
            case LoadFailed() | Failed(job=SwitchModel() | Restart()):
                self.models.failed(item, self.replies.take_back)
            case Failed():
                await self.replies.failed(item)
            case Done(job=job):
                await self._done(job)
            case _:
                raise TypeError(f"the worker sent {item!r}")

    async def _done(self, job: object) -> None:
        core = self.core
        s = core.session
        assert s is not None, "jobs run only after the session is loaded"
        view = core.view
        match job:
            case NewChat():
                await view.conversation.clear()
                core.store.new_chat()
                view.status.show(tok_s=None, ttft_ms=None, window=None, position=len(s.context))
            case SetSystem():
                system = s.system
                core.save(core.store.set_system, system)
                if s.messages:  # where it was set, as the saved chat shows it again
                    await view.conversation.add_note(system_note(system or ""))
                else:  # /system's answer (a command's note: chat_app.commands)
                    core.note(f"System prompt set: {echo(system)}" if system else "System prompt cleared.")
            case LoadMessages():
                view.status.show(position=len(s.context))
            case Params():  # a chat's settings, its thinking switch among them
                view.status.show(thinking=getattr(s, "thinking", None))
            case Restart():
                self.models.restarted()
                core.say("The model process is running again.")
            case OpenChat(chat=cid):
                await self.chats.open_chat(cid)
