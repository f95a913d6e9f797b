"""Opening models: the first one behind a progress bar, and `/model PATH`, which switches to
another; a mixin of ChatApp.

Contract:
- While a model opens, LoadProgress (above the status bar) shows the tensors read and the CPU
  kernels' step (their first build, or that they were found built), as the session's child
  process reports them (RemoteSession's `progress`). The first model is
  opened by the app's worker; if the child refuses it as bad input (a ValueError: a path, file
  or option that is wrong, found by the checks that need torch), the app ends with return code
  2 and `bad_input` set, which main() prints as its usual one line. Any other failure (out of
  memory, a crash) is a notice and the app stays up, without a model.
- `/model PATH` is refused with a notice, changing nothing, while a reply runs or a model
  opens, or when `tinyllm.model_files.precheck` (no torch, milliseconds) refuses PATH.
  Otherwise the worker opens PATH in a NEW child process while the old one stays open, and
  ends the old child (its process, and so all its memory, CUDA graphs included) only once
  the new model has loaded. A model that fails later (a corrupt checkpoint, out of memory)
  is a notice, and the old model goes on answering in its chat. Ending the old one first
  would free its memory before the new one loads, but a failed load would then leave no
  model at all; these models are small, and two fit where one does. Replies cannot be sent
  while the new model opens (the app has no session meanwhile).
- The new model starts a new chat; the old one stays saved (Ctrl+O), each reply labelled
  with the model that wrote it. The new chat keeps the old one's /set values and system
  prompt (without one, the new model's own default); --template is not carried over. The
  status bar, the reply labels and the app's sub_title name the new model.
- `/model hf:OWNER/REPO[:FILE]` downloads the model first, on the worker (tinyllm.hub, the
  Hub's cache; no byte progress in the app, the load bar waits), then opens it as above; a
  spec the Hub refuses is the same kind of notice, and the old model goes on answering.
- A saved chat opened from the chat list (Ctrl+O, Enter) brings its own model back the same
  way (chat_app.chat_model: its path, else its hf: spec), in that chat rather than a new one,
  said in one notice; a chat whose model cannot be opened stays with the model that is open,
  said in one notice (its model's name, why, and the model it goes on with). The store keeps
  the open model's path and hf: spec for the chats it saves from then on. A model --resume
  opened for its chat that the child refuses (`fallback` set) is the same kind of notice, and
  the model it would have had without --resume opens instead.
- A message sent while the first model opens waits for it: shown at once in the conversation,
  marked "waiting for the model to load", and sent (the mark gone) once the model has loaded.
  One message waits at a time: another one sent meanwhile is refused with a notice and stays
  in the input. If the model does not load, the waiting message is marked "not sent" and
  comes back to the input. (While /model opens another model, messages are refused.)
- `/model` alone shows the model's name and path.
- A model process whose log (session.log) cannot be written runs without one: one notice a run.
- A model process that ends on its own (killed, crashed) is said once, mid-reply or not, and
  the status bar says "model process ended" until the next job (a message, Ctrl+R, /clear...)
  starts a new one first: same options and settings, the chat so far (as saved) reloaded, said
  in a notice, with the load's progress shown; then the job runs. A message is never lost: if
  the new process cannot start either, it comes back to the input.
This module never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from chat_app.chat_model import gone, locate
from chat_app.events import Failed, Loaded, Progress
from chat_app.widgets.conversation import UserMessage
from chat_app.widgets.load_progress import LoadProgress
from tinyllm import hub  # no torch, as the next
from tinyllm.model_files import precheck

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from chat_app.widgets.prompt_input import PromptInput
    from tinyllm.session_protocol import ModelProcess

ENDED = "model process ended"  # the status bar's state once it has
WAITING = "waiting for the model to load"  # the mark of a message sent while it does
NOT_SENT = "not sent: the model did not load (the text is back in the input)"


class ModelSwitching:
    bad_input: str | None = None  # why the first model was refused (main() prints it, exit code 2)
    _switching_from: ModelProcess | None = None  # the session that answers again if /model fails
    _log_error_said = False  # a log that cannot be written is said once a run
    _restarting = False  # a new model process is being started in place of one that ended
    _opening_spec: str | None = None  # the hf: spec of the model being opened (None: a path)
    fallback: str | None = None  # --resume opened the chat's model: the one to open if it is refused
    opening_first = True  # the first model is opening (until it has loaded, or failed to)
    waiting: UserMessage | None = None  # a message sent while it opens, not yet begun as a reply

    @property
    def load_progress(self: ChatApp) -> LoadProgress:
        return self.query_one(LoadProgress)

    def show_loading(self: ChatApp, name: str) -> None:
        self.load_progress.start(name)
        self.status.show(state="loading", name=name)

    def report_progress(self: ChatApp, progress: Progress) -> None:
        """The loader's progress callback (the worker thread)."""
        self._outbox.put(progress)

    # ---- a message sent while the first model opens ---------------------------------------

    @property
    def loading_first(self: ChatApp) -> bool:
        """The first model is opening: a message waits for it instead of being refused."""
        return self.session is None and self.opening_first

    async def send_when_loaded(self: ChatApp, event: PromptInput.Submitted) -> None:
        if self.waiting is not None:
            self.say("A message is already waiting for the model to load; send this one after its reply.",
                     "warning")
            return
        self._accept(event)
        self.waiting = await self.conversation.add_user(event.text)
        self.waiting.mark(WAITING)

    def send_waiting(self: ChatApp) -> None:
        """The model has loaded: the waiting message goes (after the jobs queued before it)."""
        if self.waiting is not None:
            self._busy = True
            self.queue_job("send", self.waiting.text)

    async def waiting_began(self: ChatApp) -> bool:
        """The send that began was the waiting message: unmarked where it is shown. False when
        there was none, or it is no longer shown (Ctrl+N cleared the conversation meanwhile)."""
        waiting, self.waiting = self.waiting, None
        if waiting is None or not waiting.is_attached:
            return False
        waiting.mark("")
        return True

    async def waiting_refused(self: ChatApp) -> None:
        """The waiting message's send was refused before it began: it leaves the conversation
        (the caller gives its text back to the input)."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting.is_attached:
            await waiting.remove()

    def waiting_not_sent(self: ChatApp) -> None:
        """The model did not load: the waiting message stays shown, marked, its text back in the input."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            waiting.mark(NOT_SENT)
            self.prompt.give_back(waiting.text)

    # ---- the worker ------------------------------------------------------------------------

    def switch_model(self: ChatApp, old: ModelProcess, job: tuple[str, str | None, bool]) -> ModelProcess:
        """Open the job's model beside the old one; the session that serves from now on."""
        path, system, keep_chat = job
        try:
            if hub.is_hub(path):  # downloaded here, on the worker: the UI stays live meanwhile
                path = str(hub.fetch(path, progress=False))  # (its bars would write on the screen)
                precheck(path)
            new = self.open_session(progress=self.report_progress, path=path, template=None, system=system)
        except Exception as e:
            self._outbox.put(Failed("model", path, f"could not open {path}: {e} (still chatting with {old.name})"))
            return old
        self._outbox.put(Loaded(new, switched=True, keep_chat=keep_chat))
        old.close()
        return new

    # ---- the UI thread ---------------------------------------------------------------------

    def ended(self: ChatApp) -> str:
        """Why the model process is gone ("" while it runs, or while a new one starts)."""
        return "" if self.session is None or self._restarting else self.session.ended

    def restart_if_ended(self: ChatApp) -> None:
        """Before a job is queued: a model process that ended is started again first."""
        if not self.ended():
            return
        self._restarting = True
        self.show_loading(self.model_name)
        self.say("Starting the model process again; the chat so far is reloaded into it.")
        pairs = [("system", self.store.system or "")]
        self._jobs.put(("restart", pairs + [(m.role, m.content) for m in self.store.messages() if m.role != "system"]))

    def restarted(self: ChatApp) -> None:
        self._restarting = False
        self.load_progress.finish()
        self.status.show(state="ready", position=len(self.session.context))

    def say_if_ended(self: ChatApp) -> None:
        """Each drain: a model process that ended while no reply ran is said, once."""
        if self.ended() and not self.busy and self.status.fields.get("state") != ENDED:
            self.status.show(state=ENDED)
            self.say(f"{self.ended()}; the next message starts it again.", "warning")

    async def command_model(self: ChatApp, arg: str) -> None:
        if self.session is None:
            self.say("The model is still loading (or failed to load).", "warning")
            return
        if not arg:
            self.say(f"Model: {self.session.name} ({self.session.path}); /model PATH opens another.")
            return
        if self.busy:
            self.say("A reply is still running: wait for it, or press Esc, then /model again.", "warning")
            return
        try:
            if hub.is_hub(arg):
                hub.parse(arg)  # a malformed spec is refused here, before anything starts
                name = arg
            else:
                name = precheck(arg)
        except (FileNotFoundError, ValueError) as e:
            self.say(str(e), "error")
            return
        self.open_model(arg, name, keep_chat=False)

    def open_model(self: ChatApp, arg: str, name: str, keep_chat: bool) -> None:
        """Queue the switch to `arg` (a path, or an hf: spec fetched on the worker)."""
        self._switching_from, self.session = self.session, None
        self.show_loading(name)
        if hub.is_hub(arg):
            self.say(f"Getting {arg} from the Hugging Face Hub (or its cache).")
        self._opening_spec = arg if hub.is_hub(arg) else None
        path = arg if hub.is_hub(arg) else str(Path(arg).expanduser().resolve())
        self.queue_job("model", (path, self.store.system, keep_chat))

    def reopen_chat_model(self: ChatApp) -> None:
        """A saved chat was opened (the chat list): its own model, where that is not the one open."""
        store, s = self.store, self.session
        assert s is not None, "a chat is opened only while a model is"
        where, why = locate(store.chat_model_path, store.chat_model_spec)
        if where is None:
            if store.chat_model_path is not None or store.chat_model != s.name:
                self.say(gone(store.chat_model, why, s.name), "warning")
            return
        if hub.is_hub(where) and where == store.model_spec or Path(where).resolve() == Path(s.path).resolve():
            return  # the model open already
        self.open_model(where, store.chat_model, keep_chat=True)

    async def model_loaded(self: ChatApp, s: ModelProcess, switched: bool, keep_chat: bool = False) -> None:
        if switched:
            if not keep_chat:
                await self.conversation.clear()
                self.store.new_chat()  # keeps its /set values and system prompt, as the new session does
                if self.store.settings:
                    self.queue_job("params", self.store.settings)
            self.last_stats, self._compile_failure_said = None, False
            self.status.show(tok_s=None, ttft_ms=None, window=None)
            self.store.model_path, self.store.model_spec = s.path, self._opening_spec
            self.say(f"This chat's own model, {s.name}, is open again." if keep_chat else
                     f"Now chatting with {s.name}, in a new chat (the last one is saved: Ctrl+O).")
        self.session, self._switching_from, self.opening_first = s, None, False
        self.model_name = self.store.model = self.sub_title = s.name
        self.load_progress.finish()
        self.refresh_bindings()
        self.status.show(state="ready", name=s.name, device=s.device, weights=s.weights,
                         graphs=s.use_graph if s.graphs_available else None, max_len=s.max_len,
                         position=len(s.context), step=s.step_kind, capped=s.max_len < s.model_max_len)
        if s.log_error and not self._log_error_said:
            self._log_error_said = True
            self.say(f"The model process's log {s.log_error}; it logs nothing, and chatting works.", "warning")
        if s.max_len < s.model_max_len:
            self.say(f"The context is capped at {s.max_len} of the model's {s.model_max_len} positions "
                     f"to keep memory low; --max-len {s.model_max_len} lifts the cap.")
        self.send_waiting()

    def fall_back(self: ChatApp, error: ValueError) -> None:
        """--resume's model (the chat's own) passed the quick checks but not the loader's: the
        model it would have had without --resume, said in one notice."""
        path, self.fallback = str(self.fallback), None
        name = precheck(path)
        self.say(gone(self.store.chat_model, str(error), name), "warning")
        self.store.model_path, self.store.model_spec = str(Path(path).resolve()), None
        self.model_name = name
        self.show_loading(name)
        self._serve(path=path)

    def model_failed(self: ChatApp, item: Failed) -> None:
        self.load_progress.finish()
        if item.kind == "restart":
            self._restarting = False
            self.status.show(state=ENDED)
            self.say(f"Could not start the model process again: {item.message}", "error")
            return
        if item.kind == "model":  # the old model answers again
            self.session, self._switching_from = self._switching_from, None
            assert self.session is not None, "a model switch fails only from a model that was open"
            self.status.show(state="ready", name=self.session.name)
        elif isinstance(item.arg, ValueError) and self.fallback:  # a resumed chat's model the child refused
            self.fall_back(item.arg)
            return
        elif isinstance(item.arg, ValueError):  # the first model: bad input, as before the TUI
            self.bad_input = str(item.arg)
            self.exit(return_code=2)
            return
        else:
            self.opening_first = False
            self.status.show(state="failed")
            self.waiting_not_sent()
        self.say(item.message, "error")

