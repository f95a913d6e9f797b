"""The session protocol: what the app may ask of a chat session, and the messages that carry
it between the app's process and the session's child process (chat_app.remote_session <->
tinyllm.session.chat_server). Imports no torch, nor anything that does: the app's process imports it
and unpickles what the child sends.

Contract:
- `Session` is what the app calls: tinyllm.session.chat.ChatSession implements it in its own
  process, chat_app.remote_session.RemoteSession across a pipe. `ModelProcess` adds what only
  a session in a child process has (why it ended, a restart, close), which RemoteSession is.
- `JOBS` is the one dispatch table, read by both ends: each job is the name of a Session
  method and says how it runs.
    REPLY  in order, on the child's job thread; answered Started, then Events, then Done
    TASK   in order, on the job thread; answered Done
    CALL   at once, on the child's reader thread, also while a reply streams; answered Done
  Adding a job is its Session method (ChatSession's, RemoteSession's one line) and its entry here.
- Messages, all plain picklable dataclasses:
    parent -> child  the open_kwargs dict first, then Call(id, job, args) | Quit()
    child -> parent  Progress(done, total, step, seconds, compiling) while the model loads, by step:
                       "tensors"         tensors read of all
                       "kernels"         the CPU kernels' first build: C++ files compiled of
                                         all, `seconds` since it began (at least every second),
                                         `compiling`: the files a compiler is on now (Linux)
                       "kernels cached"  the CPU kernels were built before, or a wheel carries
                                         them prebuilt: loaded, no build
                       "kernels built"   the build ended (`seconds`: how long it took)
                       "kernels failed"  the build failed: PyTorch's kernels instead (slower)
                     Loaded(state) | LoadFailed(message, bad_input)   bad_input: the path, files
                       or options are wrong (one line for the user), not the machine
                     Started(id, state)     a reply was accepted; Events follow
                     Events(id, events, state)   Prefilled/Token/Finished, batched; `state`
                       only with the batch that holds Finished (None before)
                     Done(id, error, state)  a job ended: error None, or the message of the
                       ValueError it raised (state None then)
                     StateChanged(state)    a background compile ended (step_kind changed)
  The parent makes one more, Ended(reason), when the child is gone (killed, crashed, closed).
- `SessionState` is the session's public state as the parent mirrors it (`SessionState.of`).
  Its messages carry no token ids, and `context_len` stands for the context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Protocol

from tinyllm.decode.sampling_params import SamplingParams
from tinyllm.session.chat_events import Finished, Message, Prefilled, StepStats, Token

Event = Prefilled | Token | Finished
Job = Literal["send", "edit", "regenerate", "continue_reply", "new_chat", "set_system", "load_messages",
              "set_param", "set_graphs", "set_thinking", "stop"]


class Runs(Enum):
    REPLY = "reply"  # in order; streams the reply's events
    TASK = "task"  # in order; returns nothing
    CALL = "call"  # at once, from any thread, also mid-reply


JOBS: dict[Job, Runs] = {
    "send": Runs.REPLY, "edit": Runs.REPLY, "regenerate": Runs.REPLY, "continue_reply": Runs.REPLY,
    "new_chat": Runs.TASK, "set_system": Runs.TASK, "load_messages": Runs.TASK,
    "set_param": Runs.CALL, "set_graphs": Runs.CALL, "set_thinking": Runs.CALL, "stop": Runs.CALL,
}
DONE_COMPILING = ("compiled", "native", "eager", "compile failed", "plain")  # step kinds with no compile to wait for


class Session(Protocol):
    """A chat session as the app uses it. Replies are generators run on one worker thread;
    the CALL jobs may come from any thread and take effect between two tokens. Errors at
    this boundary are ValueErrors, and a failed job leaves the conversation as it was."""

    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def family(self) -> str: ...  # the model family: "llama", "qwen3", "gemma3", ...
    @property
    def dtype(self) -> str: ...  # the activations'
    @property
    def weights(self) -> str: ...  # how the matrices are held: "int4", "int8", "bf16", "fp32"...
    @property
    def graphs_available(self) -> bool: ...
    @property
    def use_graph(self) -> bool: ...  # the fast step is on: CUDA graphs, or on a CPU the native step
    @property
    def max_len(self) -> int: ...
    @property
    def model_max_len(self) -> int: ...
    @property
    def context(self) -> Sized: ...
    @property
    def system(self) -> str | None: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def messages(self) -> list[Message]: ...
    @property
    def step_kind(self) -> str: ...
    @property
    def compile_error(self) -> str: ...
    @property
    def timeline(self) -> dict[str, float]: ...
    @property
    def last_stats(self) -> StepStats | None: ...
    @property
    def thinking(self) -> bool | None: ...  # the template's thinking switch; None: it has none

    def send(self, text: str) -> Iterator[Event]: ...
    def edit(self, text: str) -> Iterator[Event]: ...  # the last user turn and its reply replaced
    def regenerate(self, params: SamplingParams | None = None) -> Iterator[Event]: ...
    def continue_reply(self) -> Iterator[Event]: ...
    def new_chat(self) -> None: ...
    def set_system(self, text: str | None) -> None: ...
    def load_messages(self, messages: list[tuple[str, str]]) -> None: ...
    def set_param(self, name: str, value: str) -> None: ...
    def set_graphs(self, on: bool) -> None: ...
    def set_thinking(self, on: bool) -> None: ...  # ValueError where the template has no switch
    def stop(self) -> None: ...
    def wait_compiled(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class Capabilities:
    """What a session can do, in one record (the app asks it, never a sentinel field): `served`:
    a server decodes (its context, sampling and speed are its own: no graphs switch, no context
    the app knows); `graphs`: Ctrl+G switches CUDA graphs; `context`: the positions the app may
    fill (0: the server's own, unknown here)."""
    served: bool
    graphs: bool
    context: int


class ModelProcess(Session, Protocol):
    """A Session served by a child process (the app's), or by a server (chat_app.server_session)."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def path(self) -> str: ...  # the model's
    @property
    def log_error(self) -> str: ...  # why the child's log could not be opened; "" when it was
    @property
    def ended(self) -> str: ...  # why the child is gone; "" while it runs

    def restart(self, messages: list[tuple[str, str]], progress: Callable[[Progress], None] | None = None) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class SessionState:
    name: str
    device: str  # "cpu" | "cuda"
    dtype: str
    graphs_available: bool
    use_graph: bool
    max_len: int  # the context's positions
    model_max_len: int  # the model's own limit (max_len may be capped below it)
    context_len: int  # ids in the context (the ids stay in the child)
    first_message: int  # the first message the context holds (older ones were dropped)
    system: str | None
    params: SamplingParams
    step_kind: str  # "plain" | "compiling" | "compiled" | "native" | "eager" | "compile failed"
    compile_error: str
    timeline: dict[str, float]  # time.time() of each start-up step
    last_stats: StepStats | None  # the last reply's
    messages: list[Message] = field(default_factory=list)  # without their ids
    weights: str = ""  # how the matrices are held ("int4", "int8", "bf16", ...)
    family: str = ""  # the model family ("llama", "qwen3", ...)
    thinking: bool | None = None  # the chat template's thinking switch; None: it has none
    context_note: str = ""  # why max_len is below model_max_len, in words ("" when it is not)

    @classmethod
    def of(cls, s: Any) -> SessionState:
        """The state of a ChatSession `s`."""
        return cls(name=s.name, device=s.device, dtype=s.dtype, graphs_available=s.graphs_available,
                   use_graph=s.use_graph, max_len=s.max_len, model_max_len=s.model_max_len,
                   context_len=len(s.context), first_message=s.first_message, system=s.system, params=s.params,
                   step_kind=s.step_kind, compile_error=s.compile_error, timeline=s.timeline,
                   last_stats=s.last_stats, messages=[Message(m.role, m.content, stopped=m.stopped) for m in s.messages],
                   weights=s.weights, family=s.family, thinking=s.thinking,
                   context_note=s.context_note)


# ---- parent -> child -------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    id: int
    job: Job
    args: tuple = ()


@dataclass(frozen=True)
class Quit:  # the reply under way stops, then the child ends
    pass


# ---- child -> parent -------------------------------------------------------------------------

LoadStep = Literal["tensors", "kernels", "kernels cached", "kernels built", "kernels failed"]


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    step: LoadStep = "tensors"
    seconds: float = 0.0  # how long the step has taken so far (the kernels' build)
    compiling: tuple[str, ...] = ()  # the kernels' build: the C++ files being compiled now (where the child can tell)


@dataclass(frozen=True)
class Loaded:
    state: SessionState


@dataclass(frozen=True)
class LoadFailed:
    message: str
    bad_input: bool  # a ValueError/FileNotFoundError: the user's to fix, in one line


@dataclass(frozen=True)
class Started:
    id: int
    state: SessionState


@dataclass(frozen=True)
class Events:
    id: int
    events: list[Event]
    state: SessionState | None = None


@dataclass(frozen=True)
class Done:
    id: int
    error: str | None
    state: SessionState | None


@dataclass(frozen=True)
class StateChanged:
    state: SessionState


@dataclass(frozen=True)
class Ended:  # made by the parent: the child is gone
    reason: str
