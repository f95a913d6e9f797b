"""ChatApp: the Textual app around one ChatSession (bindings, slash commands, one worker).

Threads: the UI thread owns every widget and the Store. ONE long-lived worker thread
(`_serve`) opens the session (a visible loading state meanwhile) and then owns it: the UI
hands it jobs (send, regenerate, new chat, system prompt, resume) through a queue, and it
runs them in order. Everything the worker learns (the session's Prefilled / Token / Finished
events, plus Loaded / Started / Done / Failed below) goes into an outbox that a timer drains
at most 30 times a second: one Markdown update per drained batch, never one per token, and
nothing is dropped. From the UI thread only the session's thread-safe calls are made
directly: stop(), set_graphs(), set_param().

Policy: a message (or Ctrl+R) while a reply runs is refused with a notice and the typed text
stays in the input; Ctrl+N and /clear stop the running reply first, /system waits for it.
Errors are caught once, in the worker, shown with notify(severity="error"), and the
conversation is kept. This module never imports torch (nor tinyllm): __main__ passes a
function that opens the session.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.widgets import Footer
from textual.worker import get_current_worker

from chat_app.store import Saved, Store
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.help_screen import HelpScreen
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.reply import Reply
from chat_app.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from tinyllm.chat import ChatSession, StepStats

DRAIN_HZ = 30
INPUT_KEYS = [("Enter", "send the message (or run a /command)"),
              ("Shift+Enter, Ctrl+J", "new line in the message (Ctrl+J also works in tmux)"),
              ("Up / Down", "earlier prompts (Up on the first line, Down on the last)")]
COMMANDS = {  # name: (arguments, what it does)
    "set": ("NAME VALUE", "sampling: temperature, top_p, top_k, repeat_penalty, max_tokens, seed"),
    "system": ("TEXT", "set the system prompt (no TEXT: none); used from the next turn"),
    "export": ("PATH", "write the conversation to PATH as Markdown"),
    "stats": ("", "speed, context and settings of the last reply"),
    "clear": ("", "clear the screen and start a new chat (like Ctrl+N)"),
    "help": ("", "this help (like F1)"),
}


# ---- what the worker tells the UI (besides the session's own events) ----------------------

@dataclass
class Loaded:
    session: ChatSession


@dataclass
class Started:  # the session accepted a send/regenerate: a reply streams next
    kind: str
    text: str


@dataclass
class Done:  # a job without a reply finished
    kind: str
    arg: Any


@dataclass
class Failed:
    kind: str
    arg: Any
    message: str


def key_name(key: str) -> str:
    return "+".join(part.upper() if len(part) == 1 else part.capitalize() for part in key.split("+"))


class ChatApp(App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "tinyllm-chat"
    ENABLE_COMMAND_PALETTE = False  # slash commands and F1 instead
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply (its text stays, marked stopped)"),
        Binding("ctrl+r", "regenerate", "Regenerate", tooltip="replace the last reply with a new one"),
        Binding("ctrl+n", "new_chat", "New chat", tooltip="start a new chat (the old one stays saved)"),
        Binding("ctrl+g", "toggle_graphs", "Graphs", tooltip="CUDA graphs on/off, from the next step"),
        Binding("f1", "help", "Help", tooltip="this help"),
        Binding("ctrl+q", "quit", "Quit", tooltip="quit", priority=True),
    ]

    def __init__(self, open_session: Callable[[], ChatSession], store: Store, model_name: str = "model",
                 resume: bool = False) -> None:
        super().__init__()
        self._open_session, self.store, self.model_name, self.resume = open_session, store, model_name, resume
        self.session: ChatSession | None = None
        self._jobs: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._reply: Reply | None = None  # the reply streaming now
        self._busy = False  # a send/regenerate is queued or running
        self._stop_wanted = False  # Esc was pressed for the reply in flight
        self._prefill_tokens = 0
        self._last_stats: StepStats | None = None
        self._compile_failure_said = False

    def compose(self):
        yield Conversation()
        yield PromptInput(id="prompt")
        yield StatusBar()
        yield Footer()

    @property
    def replying(self) -> bool:
        """A send or regenerate is queued or running."""
        return self._busy

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
        self.conversation.loading = True
        self.status.show(state="loading", name=self.model_name)
        self.prompt.focus()
        self.set_interval(1 / DRAIN_HZ, self._drain)
        self._serve()
        if self.resume:
            await self._resume()

    def say(self, message: str, severity: str = "information") -> None:
        self.notify(message, severity=severity, markup=False)  # type: ignore[arg-type]

    # ---- the worker ---------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="session", name="session")
    def _serve(self) -> None:
        worker = get_current_worker()
        try:
            session = self._open_session()
        except Exception as e:  # shown once, here; the app stays up
            self._outbox.put(Failed("load", None, f"could not load the model: {e}"))
            return
        self._outbox.put(Loaded(session))
        try:
            self._run_jobs(session, worker)
        finally:
            close = getattr(session, "close", None)  # a RemoteSession: end its process
            if close is not None:
                close()

    def _run_jobs(self, session: ChatSession, worker) -> None:
        jobs: dict[str, Callable[[Any], None]] = {"new_chat": lambda _: session.new_chat(),
                                                  "system": session.set_system, "load": session.load_messages}
        while not worker.is_cancelled:
            try:
                kind, arg = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                if kind in ("send", "regenerate"):
                    events = session.send(arg) if kind == "send" else session.regenerate()
                    self._outbox.put(Started(kind, arg))
                    for event in events:
                        self._outbox.put(event)
                        if worker.is_cancelled:
                            session.stop()
                else:
                    jobs[kind](arg)
                    self._outbox.put(Done(kind, arg))
            except Exception as e:
                message = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                self._outbox.put(Failed(kind, arg, message))

    # ---- draining the outbox (UI thread) -------------------------------------------------

    async def _drain(self) -> None:
        pieces: list[str] = []
        live: StepStats | None = None
        while self.is_running:  # not while shutting down: the widgets may be gone
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            kind = type(item).__name__
            if kind == "Token":
                pieces.append(item.text)
                live = item.stats
                continue
            if pieces and self._reply is not None:
                await self._reply.write("".join(pieces))
            pieces = []
            if kind == "Finished":
                live = None
            await self._handle(kind, item)
        if pieces and self._reply is not None:
            await self._reply.write("".join(pieces))
        if live is not None:
            self._show_stats(live, "generating")

    async def _handle(self, kind: str, item: Any) -> None:
        conversation = self.conversation
        if kind == "Loaded":
            s = self.session = item.session
            conversation.loading = False
            self.status.show(state="ready", name=s.name, device=s.device, dtype=s.dtype,
                             graphs=s.use_graph if s.graphs_available else None, max_len=s.max_len,
                             position=len(s.context), step=s.step_kind)
        elif kind == "Started":
            if item.kind == "regenerate":
                await conversation.drop_last_reply()
                self.store.drop_last_reply()
            else:
                await conversation.add_user(item.text)
                self.store.add("user", item.text)
            self._reply = await conversation.add_reply(self.model_name)
            self.status.show(state="generating")
        elif kind == "Prefilled":
            self._prefill_tokens = item.n_tokens
            if self._stop_wanted:  # Esc came before the reply began, which clears the flag: again
                self.session.stop()
            if item.dropped:
                self.say(f"Context full: the oldest {item.dropped} messages no longer reach the model "
                         "(they stay on screen and in the saved chat).", "warning")
        elif kind == "Finished":
            if self._reply is not None:
                await self._reply.finish(item.reason)
            self._reply, self._busy, self._stop_wanted = None, False, False
            self.store.add("assistant", item.text, stopped=item.reason == "stopped")
            self._show_stats(item.stats, "ready")
            if item.reason == "context_full":
                self.say(f"The reply filled the context ({item.stats.max_len} positions); "
                         "the next turn drops the oldest messages.", "warning")
        elif kind == "Failed":
            await self._failed(item)
        elif kind == "Done":
            await self._done(item)

    async def _failed(self, item: Failed) -> None:
        self.say(item.message, "error")
        if item.kind == "load":
            self.conversation.loading = False
            self.status.show(state="failed")
            return
        if item.kind in ("send", "regenerate"):
            if self._reply is not None:
                await self._reply.finish("error")
            elif item.kind == "send" and not self.prompt.text:
                self.prompt.load_text(item.arg)  # refused before it was shown: give the text back
            self._reply, self._busy, self._stop_wanted = None, False, False
            self.status.show(state="ready")

    async def _done(self, item: Done) -> None:
        assert self.session is not None, "jobs run only after the session is loaded"
        if item.kind == "new_chat":
            await self.conversation.clear()
            self.store.new_chat()
            self.status.show(tok_s=None, ttft_ms=None, window=None, position=len(self.session.context))
        elif item.kind == "system":
            self.store.set_system(self.session.system)
            system = self.session.system
            self.say(f"System prompt set: {system}" if system else "System prompt cleared.")
        elif item.kind == "load":
            self.store.set_system(self.session.system)
            self.status.show(position=len(self.session.context))
            self.say(f"Resumed the last chat ({len(item.arg)} messages).")

    def _show_stats(self, stats: StepStats, state: str) -> None:
        self.status.show(state=state, tok_s=stats.tok_per_s, ttft_ms=stats.ttft_ms, window=stats.window,
                         position=stats.position, max_len=stats.max_len, graphs=stats.graphs, step=stats.step)
        self._last_stats = stats
        if stats.step == "compile failed" and not self._compile_failure_said:
            self._compile_failure_said = True
            self.say(f"The compiled step is not available here ({self.session.compile_error}); "
                     "replies use the plain step.", "warning")

    async def _resume(self) -> None:
        saved = self.store.resume_last()
        if not saved:
            self.say("No saved chat to resume; this is a new one.")
            return
        for m in saved:
            if m.role == "user":
                await self.conversation.add_user(m.content)
            else:
                await self.conversation.add_reply(self.model_name, m.content, "stopped" if m.stopped else "")
        pairs = [("system", self.store.system)] if self.store.system else []
        self._jobs.put(("load", pairs + [(m.role, m.content) for m in saved]))

    # ---- input --------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text
        if text.startswith("/"):
            self.prompt.accept()
            await self.run_command(text)
        elif self._ready_for_reply():
            self.prompt.accept()
            self._busy = True
            self._jobs.put(("send", text))

    def _ready_for_reply(self) -> bool:
        if self.session is None:
            self.say("The model is still loading (or failed to load).", "warning")
        elif self._busy:
            self.say("A reply is still running: wait for it, or press Esc to stop it.", "warning")
        else:
            return True
        return False

    def action_stop(self) -> None:
        if self.session is not None and self._busy:
            self._stop_wanted = True
            self.session.stop()

    def action_regenerate(self) -> None:
        if self._ready_for_reply():
            self._busy = True
            self._jobs.put(("regenerate", ""))

    def action_new_chat(self) -> None:
        self.action_stop()
        self._jobs.put(("new_chat", None))

    def action_toggle_graphs(self) -> None:
        s = self.session
        if s is None:
            self.say("The model is still loading.", "warning")
        elif not s.graphs_available:
            self.say("CUDA graphs are n/a on CPU: the decoder runs the same step eagerly.", "warning")
        else:
            s.set_graphs(not s.use_graph)
            self.status.show(graphs=s.use_graph)
            self.say(f"CUDA graphs {'ON' if s.use_graph else 'OFF'} from the next step.")

    def action_help(self) -> None:
        keys = INPUT_KEYS + [(key_name(b.key), b.tooltip) for b in self.BINDINGS if isinstance(b, Binding)]
        commands = [(f"/{name} {args}".rstrip(), does) for name, (args, does) in COMMANDS.items()]
        self.push_screen(HelpScreen(keys, commands))

    # ---- slash commands -----------------------------------------------------------------

    async def run_command(self, text: str) -> None:
        name, _, arg = text[1:].partition(" ")
        if name not in COMMANDS:
            self.say(f"Unknown command /{name}; /help lists them.", "error")
            return
        await getattr(self, f"command_{name}")(arg.strip())

    async def command_set(self, arg: str) -> None:
        name, _, value = arg.partition(" ")
        name = name.replace("-", "_")
        if self.session is None or not value.strip():
            self.say("usage: /set NAME VALUE (after the model has loaded)", "error")
            return
        try:
            self.session.set_param(name, value.strip())
        except ValueError as e:
            self.say(str(e), "error")
            return
        self.say(f"{name} = {getattr(self.session.params, name)} (from the next reply)")

    async def command_system(self, arg: str) -> None:
        self._jobs.put(("system", arg))
        if self._busy:
            self.say("The system prompt changes after this reply.")

    async def command_export(self, arg: str) -> None:
        if not arg:
            self.say("usage: /export PATH", "error")
            return
        partial = Saved("assistant", self._reply.text + " …") if self._reply is not None else None
        try:
            n = self.store.export_markdown(arg, partial)
        except OSError as e:
            self.say(f"could not export to {arg}: {e}", "error")
            return
        self.say(f"Exported {n} messages to {arg}.")

    async def command_stats(self, arg: str) -> None:
        stats = self._last_stats
        if self.session is None or stats is None:
            self.say("No reply yet.")
            return
        graphs = {True: "ON", False: "OFF", None: "n/a on CPU"}[stats.graphs]
        self.say(f"Last reply: {stats.tokens} tokens at {stats.tok_per_s:.1f} tok/s, "
                 f"TTFT {stats.ttft_ms:.0f} ms (prefill of {self._prefill_tokens} tokens).\n"
                 f"Context: {stats.position}/{stats.max_len}, bucket W {stats.window}, graphs {graphs}.\n"
                 f"{self.session.params}")

    async def command_clear(self, arg: str) -> None:
        self.action_new_chat()

    async def command_help(self, arg: str) -> None:
        self.action_help()
