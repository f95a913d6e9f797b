"""Opening models: the first one behind a progress bar, and `/model PATH`, which switches to
another; the app's ModelSwitcher, which owns the open session.

Contract:
- While a model opens, LoadProgress (above the status bar) shows the tensors read and the CPU
  kernels' step (their first build, or that they were found built), as the session's child
  process reports them (RemoteSession's `progress`). The first model is
  opened by the app's worker; if the child refuses it as bad input (a ValueError: a path, file
  or option that is wrong, found by the checks that need torch), the app ends with return code
  2 and `bad_input` set, which main() prints as its usual one line. Any other failure (out of
  memory, a crash) is a notice and the app stays up, without a model.
- `/model PATH` is refused with a note (chat_app.commands), changing nothing, while a reply runs or a model
  opens, or when `tinyllm.formats.model_files.precheck` (no torch, milliseconds) refuses PATH.
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
- `/model hf:OWNER/REPO[:FILE]` downloads the model first, on the worker (tinyllm.formats.hub, the
  Hub's cache; no byte progress in the app, the load bar waits), then opens it as above; a
  spec the Hub refuses is the same kind of notice, and the old model goes on answering.
- A saved chat opened from the chat list (Ctrl+O, Enter) brings its own model back the same
  way (chat_app.chat_model: its path, else its hf: spec), in that chat rather than a new one,
  said in one notice; a chat whose model cannot be opened stays with the model that is open,
  said in one notice (its model's name, why, and the model it goes on with). The store keeps
  the open model's path and hf: spec for the chats it saves from then on. A model --resume
  opened for its chat that the child refuses (`fallback` set) is the same kind of notice, and
  the model it would have had without --resume opens instead.
- `/model URL[#MODEL]` or `/model NAME` (a [servers] table) opens an OpenAI-compatible server
  the same way (chat_app.server_session, on the worker: no child process); a server that cannot
  be reached, refuses or lacks the model is the same kind of note. Its chats are saved with
  its URL#MODEL as their model_spec (no path), which --resume and the chat list reopen.
- A message sent while the first model opens waits for it: shown at once in the conversation,
  marked "waiting for the model to load", and saved to the chat at once (chat_app.drawing's
  `ask`), and sent (the mark gone) once the model has loaded.
  One message waits at a time: another one sent meanwhile is refused with a notice and stays
  in the input. If the model does not load, the waiting message is marked "not sent", leaves
  the saved chat and comes back to the input. (While /model opens another model, messages are refused.)
- `/model` alone shows the model's name and path, as a note.
- A model process whose log (session.log) cannot be written runs without one: one notice a run.
- A model process that ends on its own (killed, crashed) is said once, mid-reply or not, and
  the status bar says "model process ended" until the next job (a message, Ctrl+R, /clear...)
  starts a new one first: same options and settings, the chat so far (as saved) reloaded, said
  in a notice, with the load's progress shown; then the job runs. A message is never lost: if
  the new process cannot start either, it comes back to the input.
This module never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from chat_app.chat_model import gone, locate
from chat_app.events import Failed
from chat_app.palette import offered_models
from chat_app.server_api import endpoint, is_server
from chat_app.widgets.conversation import UserMessage
from tinyllm.formats import hub  # no torch, as the next
from tinyllm.formats.model_files import precheck

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from chat_app.widgets.prompt_input import PromptInput
    from tinyllm.session.session_protocol import ModelProcess

ENDED = "model process ended"  # the status bar's state once it has
WAITING = "waiting for the model to load"  # the mark of a message sent while it does
NOT_SENT = "not sent: the model did not load (the text is back in the input)"


class ModelSwitcher:
    def __init__(self, app: ChatApp) -> None:
        self.app = app
        self.session: ModelProcess | None = None  # the model that answers (None while one opens)
        self.bad_input: str | None = None  # why the first model was refused (main() prints it, exit code 2)
        self.fallback: str | None = None  # --resume opened the chat's model: the one to open if it is refused
        self.opening_first = True  # the first model is opening (until it has loaded, or failed to)
        self.waiting: UserMessage | None = None  # a message sent while it opens, not yet begun as a reply
        self._switching_from: ModelProcess | None = None  # the session that answers again if /model fails
        self._log_error_said = False  # a log that cannot be written is said once a run
        self._restarting = False  # a new model process is being started in place of one that ended
        self._opening_spec: str | None = None  # the hf: spec of the model being opened (None: a path)

    def show_loading(self, name: str) -> None:
        self.app.load_progress.start(name)
        self.app.status.show(state="loading", name=name)

    # ---- a message sent while the first model opens ---------------------------------------

    @property
    def loading_first(self) -> bool:
        """The first model is opening: a message waits for it instead of being refused."""
        return self.session is None and self.opening_first

    async def send_when_loaded(self, event: PromptInput.Submitted) -> None:
        app = self.app
        if self.waiting is not None:
            app.say("A message is already waiting for the model to load; send this one after its reply.", "warning")
            return
        asked = app.drawer.ask(event.text)  # in the chat first (chat_app.drawing)
        app.accept(event)
        self.waiting = await app.conversation.add_user(event.text, saved=asked)
        self.waiting.mark(WAITING)

    def send_waiting(self) -> None:
        """The model has loaded: the waiting message goes (after the jobs queued before it), and
        its mark goes now: the status bar says "ready" from here on."""
        if self.waiting is not None:
            self.waiting.mark("")
            self.app.drawer.begin("send", self.waiting.text)

    async def waiting_began(self) -> bool:
        """The send that began was the waiting message: unmarked where it is shown. False when
        there was none, or it is no longer shown (Ctrl+N cleared the conversation meanwhile)."""
        waiting, self.waiting = self.waiting, None
        if waiting is None or not waiting.is_attached:
            return False
        waiting.mark("")
        return True

    async def waiting_refused(self) -> None:
        """The waiting message's send was refused before it began: it leaves the conversation
        (the caller gives its text back to the input)."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting.is_attached:
            await waiting.remove()

    def waiting_not_sent(self) -> None:
        """The model did not load: the waiting message stays shown, marked, its text back in the input."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            self.app.drawer.take_back()  # saved when it was sent (chat_app.drawing): not in the chat
            waiting.saved = None
            waiting.mark(NOT_SENT)
            self.app.prompt.give_back(waiting.text)

    # ---- a model process that ended --------------------------------------------------------

    def ended(self) -> str:
        """Why the model process is gone ("" while it runs, or while a new one starts)."""
        return "" if self.session is None or self._restarting else self.session.ended

    def restart_if_ended(self) -> None:
        """Before a job is queued: a model process that ended is started again first."""
        if not self.ended():
            return
        app = self.app
        self._restarting = True
        self.show_loading(app.model_name)
        app.say("Starting the model process again; the chat so far is reloaded into it.")
        pairs = [("system", app.store.system or "")]  # not the message being sent: saved already, its job brings it
        app.session_worker.put("restart", pairs + [(m.role, m.content) for m in app.store.messages()
                                                   if m.role != "system" and m is not app.drawer.asked])

    def restarted(self) -> None:
        self._restarting = False
        self.app.load_progress.finish()
        assert self.session is not None
        self.app.status.show(state="ready", position=len(self.session.context))

    def say_if_ended(self) -> None:
        """Each drain: a model process that ended while no reply ran is said, once."""
        app = self.app
        if self.ended() and not app.busy and app.status.fields.get("state") != ENDED:
            app.status.show(state=ENDED)
            app.say(f"{self.ended()}; the next message starts it again.", "warning")

    # ---- /model and a saved chat's own model -----------------------------------------------

    async def command_model(self, arg: str) -> None:
        app = self.app
        if self.session is None:
            app.note("The model is still loading (or failed to load).", "warning")
            return
        if not arg:
            app.note(models_note(self.session.name, self.session.path, offered_models(app)))
            return
        if app.busy:
            app.note("A reply is still running: wait for it, or press Esc, then /model again.", "warning")
            return
        try:
            if is_server(arg, app.servers):
                endpoint(arg, app.servers)  # a malformed URL or a missing key variable: refused here
                name = arg
            elif hub.is_hub(arg):
                hub.parse(arg)  # a malformed spec is refused here, before anything starts
                name = arg
            else:
                name = precheck(arg)
        except (FileNotFoundError, ValueError) as e:
            app.note(str(e), "error")
            return
        self.open_model(arg, name, keep_chat=False)

    def open_model(self, arg: str, name: str, keep_chat: bool) -> None:
        """Queue the switch to `arg` (a path, or an hf: spec fetched on the worker)."""
        app = self.app
        self._switching_from, self.session = self.session, None
        self.show_loading(name)
        if hub.is_hub(arg):
            app.say(f"Getting {arg} from the Hugging Face Hub (or its cache).")
        self._opening_spec = arg if hub.is_hub(arg) else None
        path = arg if hub.is_hub(arg) or is_server(arg, app.servers) else str(Path(arg).expanduser().resolve())
        app.queue_job("model", (path, app.store.system, keep_chat))

    def reopen_chat_model(self) -> None:
        """A saved chat was opened (the chat list): its own model, where that is not the one open."""
        store, s = self.app.store, self.session
        assert s is not None, "a chat is opened only while a model is"
        where, why = locate(store.chat_model_path, store.chat_model_spec)
        if where is None:
            if store.chat_model_path is not None or store.chat_model != s.name:
                self.app.say(gone(store.chat_model, why, s.name), "warning")
            return
        if is_server(where, self.app.servers):
            if where != s.path:
                self.open_model(where, store.chat_model, keep_chat=True)
            return
        if hub.is_hub(where) and where == store.model_spec or Path(where).resolve() == Path(s.path).resolve():
            return  # the model open already
        self.open_model(where, store.chat_model, keep_chat=True)

    # ---- what the worker reports -----------------------------------------------------------

    async def loaded(self, s: ModelProcess, switched: bool, keep_chat: bool = False) -> None:
        app = self.app
        if switched:
            if not keep_chat:
                await app.conversation.clear()
                app.store.new_chat()  # keeps its /set values and system prompt, as the new session does
                if app.store.settings:
                    app.queue_job("params", app.store.settings)
            app.drawer.forget_stats()
            server = s.step_kind == "remote"  # a server: no path; its URL#MODEL reopens it
            app.store.model_path, app.store.model_spec = (None, s.path) if server else (s.path, self._opening_spec)
            app.say(f"This chat's own model, {s.name}, is open again." if keep_chat else
                    f"Now chatting with {s.name}, in a new chat (the last one is saved: Ctrl+O).")
        self.session, self._switching_from, self.opening_first = s, None, False
        app.model_name = app.store.model = app.sub_title = s.name
        app.load_progress.finish()
        app.refresh_bindings()
        app.status.show(state="ready", name=s.name, device=s.device, weights=s.weights,
                        graphs=s.use_graph if s.graphs_available else None, max_len=s.max_len,
                        position=len(s.context), step=s.step_kind, capped=s.max_len < s.model_max_len,
                        family=getattr(s, "family", ""), thinking=getattr(s, "thinking", None))
        if s.log_error and not self._log_error_said:
            self._log_error_said = True
            app.say(f"The model process's log {s.log_error}; it logs nothing, and chatting works.", "warning")
        if s.context_note:
            app.say(s.context_note[0].upper() + s.context_note[1:] + ".")
        self.send_waiting()

    def _fall_back(self, error: ValueError) -> None:
        """--resume's model (the chat's own) passed the quick checks but not the loader's: the
        model it would have had without --resume, said in one notice."""
        app = self.app
        path, self.fallback = str(self.fallback), None
        name = precheck(path)
        app.say(gone(app.store.chat_model, str(error), name), "warning")
        app.store.model_path, app.store.model_spec = str(Path(path).resolve()), None
        app.model_name = name
        self.show_loading(name)
        app.session_worker.start(path=path)

    def failed(self, item: Failed) -> None:
        app = self.app
        app.load_progress.finish()
        if item.kind == "restart":
            self._restarting = False
            app.status.show(state=ENDED)
            app.say(f"Could not start the model process again: {item.message}", "error")
            return
        if item.kind == "model":  # the old model answers again; why is /model's answer, a note
            self.session, self._switching_from = self._switching_from, None
            assert self.session is not None, "a model switch fails only from a model that was open"
            app.status.show(state="ready", name=self.session.name)
            app.note(item.message, "error")
            return
        if isinstance(item.arg, ValueError) and self.fallback:  # a resumed chat's model the child refused
            self._fall_back(item.arg)
            return
        elif isinstance(item.arg, ValueError):  # the first model: bad input, as before the TUI
            self.bad_input = str(item.arg)
            app.exit(return_code=2)
            return
        else:
            self.opening_first = False
            app.status.show(state="failed")
            self.waiting_not_sent()
        app.say(item.message, "error")


def models_note(name: str, path: str, known: list[tuple[str, str]]) -> str:
    """/model's answer: the model open, then every model known here (the models folder's, those
    saved chats used: what Tab and the palette offer), the open one marked."""
    def key(where: str) -> str:
        return where if where.startswith(("hf:", "http://", "https://")) or "/" not in where else os.path.realpath(where)

    here = key(path)
    lines = [f"Model: {name} ({path}). /model PATH opens another (Tab completes these; * is open):"]
    for name, where in known:
        mine = key(where) == here
        lines.append(f"{'*' if mine else ' '} {name}: {where}")
    return "\n".join(lines)
