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
  marked "waiting for the model to load", and saved to the chat at once (chat_app.replies
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chat_app.chat_model import gone, locate
from chat_app.core import ENDED
from chat_app.events import Failed, LoadFailed
from chat_app.jobs import Params, Restart, Send, SwitchModel
from chat_app.known_models import offered_models
from chat_app.server_api import endpoint, is_server
from chat_app.turn import TurnState
from tinyllm.formats import hub  # no torch, as the next
from tinyllm.formats.model_files import precheck

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from tinyllm.session.session_protocol import ModelProcess

WAITING = "waiting for the model to load"  # the mark of a message sent while it does
NOT_SENT = "not sent: the model did not load (the text is back in the input)"


class ModelSwitcher:
    def __init__(self, core: ChatCore) -> None:
        self.core = core
        self.fallback: str | None = None  # --resume opened the chat's model: the one to open if it is refused
        self._switching_from: ModelProcess | None = None  # the session that answers again if /model fails
        self._log_error_said = False  # a log that cannot be written is said once a run
        self._opening_spec: str | None = None  # the hf: spec of the model being opened (None: a path)

    # ---- a message sent while the first model opens ---------------------------------------

    @property
    def loading_first(self) -> bool:
        """The first model is opening: a message waits for it instead of being refused."""
        return self.core.session is None and self.core.opening_first

    async def send_when_loaded(self, text: str, ask: Callable[[str], object], accept: Callable[[], None]) -> None:
        """A message sent while the first model opens: saved (`ask`), taken from the input
        (`accept`), shown marked, and the turn WAITING for the model."""
        core = self.core
        if core.turn.state is TurnState.WAITING:
            core.say("A message is already waiting for the model to load; send this one after its reply.", "warning")
            return
        ask(text)  # in the chat first (chat_app.replies)
        accept()
        core.turn.move(TurnState.WAITING)
        core.turn.shown = await core.view.conversation.add_user(text, saved=core.turn.asked)
        core.turn.shown.mark(WAITING)

    def send_waiting(self) -> None:
        """The model has loaded: the waiting message goes (after the jobs queued before it), and
        its mark goes now: the status bar says "ready" from here on."""
        turn = self.core.turn
        if turn.state is TurnState.WAITING:
            turn.shown.mark("")
            self.core.begin(Send(turn.shown.text))

    def waiting_not_sent(self, take_back: Callable[[], None]) -> None:
        """The model did not load: the waiting message stays shown, marked, its text back in the
        input, and out of the saved chat (`take_back`)."""
        turn = self.core.turn
        if turn.state is not TurnState.WAITING:
            return
        shown = turn.shown
        take_back()
        turn.shown = None
        turn.end()
        shown.saved = None
        shown.mark(NOT_SENT)
        self.core.view.prompt.give_back(shown.text)

    # ---- a model process that ended --------------------------------------------------------

    def restarted(self) -> None:
        core = self.core
        core.restarting = False
        core.view.load_progress.finish()
        assert core.session is not None
        core.view.status.show(state="ready", position=len(core.session.context))

    def say_if_ended(self) -> None:
        """A model process that ended while no reply ran is said, once."""
        core = self.core
        if core.ended() and not core.busy and core.view.status.fields.get("state") != ENDED:
            core.view.status.show(state=ENDED)
            core.say(f"{core.ended()}; the next message starts it again.", "warning")

    # ---- /model and a saved chat's own model -----------------------------------------------

    async def command_model(self, arg: str) -> None:
        core = self.core
        if core.session is None:
            core.note("The model is still loading (or failed to load).", "warning")
            return
        if not arg:
            known = offered_models(core.store, core.servers, core.session)
            core.note(models_note(core.session.name, core.session.path, known))
            return
        if core.busy:
            core.note("A reply is still running: wait for it, or press Esc, then /model again.", "warning")
            return
        try:
            if is_server(arg, core.servers):
                endpoint(arg, core.servers)  # a malformed URL or a missing key variable: refused here
                name = arg
            elif hub.is_hub(arg):
                hub.parse(arg)  # a malformed spec is refused here, before anything starts
                name = arg
            else:
                name = precheck(arg)
        except (FileNotFoundError, ValueError) as e:
            core.note(str(e), "error")
            return
        self.open_model(arg, name, keep_chat=False)

    def open_model(self, arg: str, name: str, keep_chat: bool) -> None:
        """Queue the switch to `arg` (a path, or an hf: spec fetched on the worker)."""
        core = self.core
        self._switching_from, core.session = core.session, None
        core.show_loading(name)
        if hub.is_hub(arg):
            core.say(f"Getting {arg} from the Hugging Face Hub (or its cache).")
        self._opening_spec = arg if hub.is_hub(arg) else None
        path = arg if hub.is_hub(arg) or is_server(arg, core.servers) else str(Path(arg).expanduser().resolve())
        core.queue(SwitchModel(path, core.store.system, keep_chat))

    def reopen_chat_model(self) -> None:
        """A saved chat was opened (the chat list): its own model, where that is not the one open."""
        core = self.core
        store, s = core.store, core.session
        assert s is not None, "a chat is opened only while a model is"
        where, why = locate(store.chat_model_path, store.chat_model_spec)
        if where is None:
            if store.chat_model_path is not None or store.chat_model != s.name:
                core.say(gone(store.chat_model, why, s.name), "warning")
            return
        if is_server(where, core.servers):
            if where != s.path:
                self.open_model(where, store.chat_model, keep_chat=True)
            return
        if hub.is_hub(where) and where == store.model_spec or Path(where).resolve() == Path(s.path).resolve():
            return  # the model open already
        self.open_model(where, store.chat_model, keep_chat=True)

    # ---- what the worker reports -----------------------------------------------------------

    async def loaded(self, s: ModelProcess, switched: bool, keep_chat: bool = False) -> None:
        core = self.core
        view, store = core.view, core.store
        if switched:
            if not keep_chat:
                await view.conversation.clear()
                store.new_chat()  # keeps its /set values and system prompt, as the new session does
                if store.settings:
                    core.queue(Params(store.settings))
            core.forget_stats()
            served = s.capabilities.served  # a server: no path; its URL#MODEL reopens it
            store.model_path, store.model_spec = (None, s.path) if served else (s.path, self._opening_spec)
            core.say(f"This chat's own model, {s.name}, is open again." if keep_chat else
                     f"Now chatting with {s.name}, in a new chat (the last one is saved: Ctrl+O).")
        core.session, self._switching_from, core.opening_first = s, None, False
        core.model_name = store.model = s.name
        view.load_progress.finish()
        view.titled(s.name)
        view.status.show(state="ready", name=s.name, device=s.device, weights=s.weights,
                         graphs=s.use_graph if s.graphs_available else None, max_len=s.max_len,
                         position=len(s.context), step=s.step_kind, capped=s.max_len < s.model_max_len,
                         family=getattr(s, "family", ""), thinking=getattr(s, "thinking", None))
        if s.log_error and not self._log_error_said:
            self._log_error_said = True
            core.say(f"The model process's log {s.log_error}; it logs nothing, and chatting works.", "warning")
        if s.context_note:
            core.say(s.context_note[0].upper() + s.context_note[1:] + ".")
        self.send_waiting()

    def _fall_back(self, error: ValueError) -> None:
        """--resume's model (the chat's own) passed the quick checks but not the loader's: the
        model it would have had without --resume, said in one notice."""
        core = self.core
        path, self.fallback = str(self.fallback), None
        name = precheck(path)
        core.say(gone(core.store.chat_model, str(error), name), "warning")
        core.store.model_path, core.store.model_spec = str(Path(path).resolve()), None
        core.model_name = name
        core.show_loading(name)
        core.worker.start(path=path)

    def failed(self, item: LoadFailed | Failed, take_back: Callable[[], None]) -> None:
        """The first model, a /model switch or a restart failed (`take_back`: the waiting
        message out of the saved chat)."""
        core = self.core
        core.view.load_progress.finish()
        if isinstance(item, Failed) and isinstance(item.job, Restart):
            core.restarting = False
            core.view.status.show(state=ENDED)
            core.say(f"Could not start the model process again: {item.message}", "error")
            return
        if isinstance(item, Failed):  # /model: the old model answers again; why is /model's answer, a note
            core.session, self._switching_from = self._switching_from, None
            assert core.session is not None, "a model switch fails only from a model that was open"
            core.view.status.show(state="ready", name=core.session.name)
            core.note(item.message, "error")
            return
        if isinstance(item.error, ValueError) and self.fallback:  # a resumed chat's model the child refused
            self._fall_back(item.error)
            return
        if isinstance(item.error, ValueError):  # the first model: bad input, as before the TUI
            core.bad_input = str(item.error)
            core.view.exit_app(2)
            return
        core.opening_first = False
        core.view.status.show(state="failed")
        self.waiting_not_sent(take_back)
        core.say(item.message, "error")


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
