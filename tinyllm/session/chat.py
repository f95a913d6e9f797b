"""ChatSession: the one facade the UI talks to (turns in, events out; no UI here).

A thin composition of three parts, each with its own contract:
- `Conversation` (tinyllm.session.conversation, no torch): the messages, the system prompt, the chat
  template, the context ids the model sees, fitting them to the context, and undo.
- `DecodeRunner` (tinyllm.session.decode_runner): the `GraphDecoder` and one reply's decoding: the
  prefill of the new ids, the chunked launches, stop ids, `stop()`, graphs on/off, the stats.
- `StepPolicy` (tinyllm.session.step_policy): which step runs (plain, native, compiled) and the
  background compiles; `step_kind` and `compile_error` say where it stands.

A conversation is a list of `Message`s, each with the token ids it contributes; the cache
holds a prefix of their concatenation. A new user turn is rendered with the chat template,
encoded, and only its NEW ids are prefilled at the current position, so time to first token
does not grow with the chat. The reply streams as events:

  Prefilled(n_tokens, ms, dropped)      once per reply: the prefill is done
  Token(text, stats)                    one per generated token (text may be "")
  Finished(reason, text, stats)         reason: "eos" | "max_tokens" | "stopped" | "context_full" | "repeating"

`compile`: None (the plain step), "plain" (the plain step, its graphs captured ahead: no compile),
"inductor" (compiled in the background, taking over at a reply boundary), "native" (the CPU step as
one C++ call; a ValueError where it cannot run the model), "auto" (the default, what the app asks
for: "native" on a CPU where it runs the model, "plain" on CUDA, else "inductor"); see
tinyllm.session.step_policy.

Contract:
- `send(text)` / `edit(text)` / `regenerate()` / `continue_reply()` return generators; run them on ONE worker
  thread. `stop()`, `set_graphs(on)` and the setters may be called from any thread: they take
  effect between two tokens (a reply reads its settings once, at its start). `set_graphs` is
  the fast step's switch: CUDA graphs on a GPU, the native step on a CPU (`use_graph` says
  whether it is on). Graphs toggled mid-reply change no token; the native step, none but a
  near-tie that fp32 rounding decides.
- Context full: when the next turn plus a reply reserve would not fit, the oldest whole
  turns are dropped from what the model sees (the system prompt stays), the rest is
  re-prefilled once, and Prefilled.dropped says how many messages went. `messages` still
  holds everything that was said. A single message too long for the context is a ValueError,
  and so is a system prompt that leaves no room for one: `set_system` refuses it, and where
  one came in anyway (a resumed chat, --system) each message's error names the system prompt,
  not the message.
- Errors at this boundary (bad settings, a message that cannot fit) are ValueErrors; the
  conversation is unchanged by a failed call, and by a reply that fails before its first event.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode.sampling import SamplingParams
from tinyllm.formats.load_policy import resolve_device
from tinyllm.formats.model_format import Progress
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.model import Transformer
from tinyllm.session.chat_events import Finished, Message, Prefilled, StepStats, Token
from tinyllm.session.context import Context, choose_context
from tinyllm.session.conversation import Conversation, or_restore, stop_ids
from tinyllm.session.decode_runner import CHUNK, CPU_CHUNK, DecodeRunner
from tinyllm.session.step_policy import StepPolicy
from tinyllm.text.chat_template import ChatTemplate
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["CHUNK", "ChatSession", "Finished", "Message", "Prefilled", "StepStats", "Token",
           "default_cpu_threads", "open_session"]

Events = Iterator[Prefilled | Token | Finished]


class ChatSession:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, template: ChatTemplate,
                 max_len: int | None = None, params: SamplingParams = SamplingParams(),
                 system: str | None = None, use_graph: bool | None = None, name: str = "model",
                 compile: str | None = "auto", chunk: int | None = None, threads: int | None = None,
                 source: tuple[str, str] | None = None, context: Context | None = None):
        self.model, self.tokenizer, self.template, self.name = model, tokenizer, template, name
        # How max_len was chosen (tinyllm.session.context); None: as given, or the model's own.
        self.context_choice = context
        # (path, quant) the model was opened with: on a CPU a child process then compiles the
        # step first, away from this process's GIL (tinyllm.decode.compile_child).
        self.source = source
        self.marks: dict[str, float] = {}  # time.time() of each start-up step (see `timeline`)
        # torch's CPU thread count is per thread (OpenMP): set it in every thread that decodes.
        self.threads = (threads or default_cpu_threads()) if model.device.type == "cpu" else None
        self.params = params
        if chunk is None:  # steps a run: CHUNK on CUDA, CPU_CHUNK on a CPU (tinyllm.session.decode_runner)
            chunk = CHUNK if model.device.type == "cuda" else CPU_CHUNK
        self.runner = DecodeRunner(model, tokenizer, max_len, use_graph, chunk, self.threads,
                                   stop_ids(tokenizer, template))
        self.max_len = self.runner.max_len
        self.policy = StepPolicy(model, self.decoder, compile, self.threads, source)
        self.policy.capture_ahead(tokenizer.bos_id, params.greedy, chunk, params.filtered)  # where asked for
        self.marks["graphs_captured"] = time.time()
        self.policy.begin(params.greedy)
        self.conversation = Conversation(tokenizer, template, self.max_len, self.decoder, system)

    # ---- what the parts hold ---------------------------------------------------------

    @property
    def decoder(self) -> GraphDecoder:
        return self.runner.decoder

    @property
    def device(self) -> str:
        return self.model.device.type

    @property
    def model_max_len(self) -> int:
        """The model's own context (max_len may be less: `context_note` says why)."""
        return self.model.cfg.max_seq_len

    @property
    def context_note(self) -> str:
        """Why max_len is less than the model's own context, in one sentence; "" when it is not."""
        if self.context_choice is not None:
            return self.context_choice.note
        if self.max_len < self.model_max_len:
            return f"the context is {self.max_len:,} of the model's {self.model_max_len:,} positions, as asked"
        return ""

    @property
    def family(self) -> str:
        """The model family ("llama", "qwen3", "gemma3", ...: tinyllm.model.ModelConfig)."""
        return getattr(self.model.cfg, "family", "")

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    @functools.cached_property
    def weights(self) -> str:
        """How the matrices are held: "int4", "int8" (both: "int4+int8", the more common first),
        else the float dtype ("bf16", "fp16", "fp32"). Once: every state the child sends has it."""
        from collections import Counter

        from tinyllm.core.quant_linear import QuantLinear

        kinds = Counter(m.kind for m in self.model.modules() if isinstance(m, QuantLinear))
        if kinds:
            return "+".join(k for k, _ in kinds.most_common())
        return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(self.dtype, self.dtype)

    @property
    def messages(self) -> list[Message]:
        """Everything said (the model sees messages[first_message:])."""
        return self.conversation.messages

    @property
    def context(self) -> list[int]:
        """The ids the model sees; the cache holds a prefix of them."""
        return self.conversation.context

    @property
    def first_message(self) -> int:
        return self.conversation.first_message

    @property
    def system(self) -> str | None:
        return self.conversation.system

    @property
    def graphs_available(self) -> bool:
        return self.runner.graphs_available

    @property
    def chunk(self) -> int:
        """Decode steps per replay (tests set it: 1 decodes token by token)."""
        return self.runner.chunk

    @chunk.setter
    def chunk(self, n: int) -> None:
        self.runner.chunk = n

    @property
    def stop_ids(self) -> set[int]:
        """The ids that end a reply (an empty set: replies run to max_tokens)."""
        return self.runner.stop_ids

    @stop_ids.setter
    def stop_ids(self, ids: set[int]) -> None:
        self.runner.stop_ids = ids

    @property
    def last_stats(self) -> StepStats | None:
        return self.runner.last_stats

    def encode(self, text: str) -> list[int]:
        """Encode text, mapping literal "<s>" / "</s>" to BOS / EOS (templates use them)."""
        return self.conversation.encode(text)

    # ---- the step (tinyllm.session.step_policy) ----------------------------------------------

    @property
    def native(self) -> bool:
        return self.policy.native

    @property
    def compile_started(self) -> threading.Event:
        """Set at each background compile's start (the app's server watches it)."""
        return self.policy.compile_started

    @property
    def step_kind(self) -> str:
        """The step the next reply runs: "native", "plain" (no compile asked), "compiling" (a
        compile runs, or the settings' sampler variant is not compiled yet), "compiled", or
        "compile failed" (see compile_error; the plain step stays)."""
        return self.policy.step_kind(self.params.greedy)

    @property
    def compile_error(self) -> str:
        return self.policy.compile_error

    @property
    def timeline(self) -> dict[str, float]:
        """time.time() of each start-up step so far: those in `marks` (open_session adds
        "open_started" and "model_loaded", the app's child process its own) and "compiled"
        once the background compile has ended."""
        done = self.policy.compiled_at
        return dict(self.marks, **({"compiled": done} if done else {}))

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the running background compile is over (compiled or failed); False on timeout."""
        return self.policy.wait_compiled(timeout)

    def prepare(self) -> None:
        """Between replies, on the worker thread (the app's server calls it as soon as a compile
        ends; a reply calls it at its start): the compiled step takes over where it is ready,
        its graphs captured ahead (StepPolicy.prepare)."""
        self.policy.prepare(self.params.greedy, self.chunk, self.params.filtered)

    # ---- settings (any thread) -------------------------------------------------------

    @property
    def use_graph(self) -> bool:
        """The fast step is on: CUDA graphs on a GPU; on a CPU the native step (False where
        none runs)."""
        return self.runner.use_graph if self.graphs_available else self.policy.native_on

    def set_graphs(self, on: bool) -> None:
        """The fast step on/off from the next step on, mid-reply too, changing no greedy token:
        CUDA graphs on a GPU; on a CPU the native step against the plain step run eagerly
        (StepPolicy.set_native). ValueError on a CPU where the native step does not run."""
        if self.graphs_available:
            self.runner.set_graphs(on)
        else:
            self.policy.set_native(on)

    def stop(self) -> None:
        """Ask the running reply to finish after the current token."""
        self.runner.stop()

    @property
    def thinking(self) -> bool | None:
        """The chat template's thinking switch (Qwen 3's enable_thinking); None: it has none."""
        return self.conversation.thinking

    def set_thinking(self, on: bool) -> None:
        """Thinking on/off from the next reply (its generation prompt; an earlier turn is sent
        back as the template renders it either way). ValueError where the template has no switch."""
        if self.conversation.thinking is None:
            raise ValueError("thinking does not apply: this model's chat template has no enable_thinking switch")
        self.conversation.thinking = bool(on)

    def set_param(self, name: str, value: str) -> None:
        self.params = self.params.with_value(name, value)

    def set_system(self, text: str | None) -> None:
        """A new system prompt; the conversation's context is rebuilt (next turn re-prefills).
        ValueError, changing nothing, for one that leaves no room for a message and its reply."""
        self.conversation.set_system(text, self.params.max_tokens)

    def new_chat(self) -> None:
        self.conversation.new_chat()

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        """Restore a conversation (resume): (role, content) pairs, re-encoded. A user turn
        followed by another (a crash before its reply began) gets an empty stopped reply, so
        turns alternate. A last user turn stays as it is: the context ends ready for its
        reply, which regenerate() generates."""
        self.conversation.load_messages(messages)

    # ---- replies (worker thread) ------------------------------------------------------

    def send(self, text: str) -> Events:
        """Add a user turn and stream the reply. All or nothing: if the reply fails before its
        first event, the user turn is taken back (and any turns dropped to make room return)."""
        dropped, undo = self.conversation.add_user(text, self.params.max_tokens)
        return or_restore(self._reply(dropped), undo)

    def edit(self, text: str) -> Events:
        """Replace the last user turn and its reply with the user turn `text`, and stream its
        reply: the model sees what it would have seen had `text` been sent instead
        (Conversation.replace_last_turn), so a greedy reply equals a fresh chat's that sent it.
        All or nothing: if the reply fails before its first event, the old turn and its reply
        are put back."""
        dropped, undo = self.conversation.replace_last_turn(text, self.params.max_tokens)
        return or_restore(self._reply(dropped), undo)

    def regenerate(self, params: SamplingParams | None = None) -> Events:
        """Replace the last reply with a new one (the cache is rewound to before it); after a
        last user turn with no reply (a resumed chat), generate its reply. `params`: the new
        reply's settings, where given (the app's Ctrl+R: SamplingParams.regenerating); the
        session's stay as they are for the next reply. All or nothing: if the new reply fails
        before its first event, the old one is put back."""
        undo = self.conversation.take_back_reply()
        return self._reply(0, params) if undo is None else or_restore(self._reply(0, params), undo)

    def continue_reply(self) -> Events:
        """Extend the last reply from where it ended (a limit, Esc, a full context): the model
        sees the reply without its closing suffix and goes on. Its Finished carries the whole
        reply's text, and the conversation keeps ONE assistant message. All or nothing, like
        regenerate()."""
        old, body, undo = self.conversation.reopen_reply()
        return self.conversation.joined(old, body, or_restore(self._reply(0), undo))

    def _reply(self, dropped: int, params: SamplingParams | None = None) -> Events:
        """The reply to the context as it stands at the first next(), with the settings then
        (`params` where given)."""
        def record(ids: list[int], text: str, reason: str) -> None:
            self.conversation.add_reply(ids, text, stopped=reason == "stopped")

        yield from self.runner.reply(self.context, params or self.params, dropped, self.policy, record)


def default_cpu_threads() -> int:
    """Torch threads for decoding on a CPU: one per core this process may use, less one for
    the UI and the rest of the machine, at most 8 (docs/INFERENCE.md, "CPU threads")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores - 1))


def open_session(path: str | Path, device: str = "auto", max_len: int | None = None,
                 params: SamplingParams = SamplingParams(), system: str | None = None,
                 use_graph: bool | None = None, template: str | None = None,
                 compile: str | None = "auto", threads: int | None = None,
                 quant: str = DEFAULT, progress: Progress | None = None,
                 context_budget: float | None = None) -> ChatSession:
    """Open a model (tinyllm checkpoint folder, Hugging Face folder or .gguf file; see
    tinyllm.formats.open_model) in a ChatSession, its matrices held as `quant` says (tinyllm.formats.quant_rule).
    On a CPU, torch uses `threads` threads (default: default_cpu_threads()). Without a system
    prompt, the model's own default one (what its Jinja chat template writes when there is
    none) is used. `progress(done, total)` hears each tensor read (tinyllm.formats.model_format.with_progress).
    The context is `max_len` if given (at most the model's own), else the model's own up to
    `context_budget` of free memory (tinyllm.session.context.choose_context)."""
    from tinyllm.formats.open_model import open_any

    started = time.time()
    dev = resolve_device(device)
    if dev.type == "cpu":
        torch.set_num_threads(threads or default_cpu_threads())  # for loading; replies set it again
    model, tokenizer, chat_template, name = open_any(path, dev, template=template, quant=quant, progress=progress)
    loaded = time.time()
    if system is None:
        system = getattr(chat_template, "default_system", None)
    context = choose_context(model.cfg, dev, max_len, context_budget)  # K/V in bf16: CUDA's, the native step's
    session = ChatSession(model, tokenizer, chat_template, max_len=context.max_len, params=params,
                          system=system, use_graph=use_graph, name=name, compile=compile, threads=threads,
                          source=(os.path.abspath(path), quant), context=context)
    session.marks.update(open_started=started, model_loaded=loaded)
    return session
