"""ChatSession: the one facade the UI talks to (turns in, events out; no UI here).

It owns the model, tokenizer, a `GraphDecoder` (its `StaticKVCache`) and the sampling
settings. A conversation is a list of `Message`s, each with the token ids it contributes;
the cache holds a prefix of their concatenation. A new user turn is rendered with the chat
template, encoded, and only its NEW ids are prefilled at the current position, so time to
first token does not grow with the chat. The reply streams as events:

  Prefilled(n_tokens, ms, dropped)      once per reply: the prefill is done
  Token(text, stats)                    one per generated token (text may be "")
  Finished(reason, text, stats)         reason: "eos" | "max_tokens" | "stopped" | "context_full"

Decoding: the sampler runs inside the decode step (`StepSampler`, seeded noise), and the
decoder runs CHUNK steps per replay, launched ahead of the one being read (at most two in
flight): the host reads ids once per chunk, never once per token. A reply that ends inside a
chunk (a stop id, Esc, the token limit) rewinds the cache to exactly what a token-by-token
run holds. A run never crosses a bucket boundary, so chunked and token-by-token decoding
are the same steps, bit for bit. With `compile="inductor"` (the default) the step is compiled
on a background thread (`BackgroundCompile`) while replies run on the plain step, and the
compiled step takes over at the start of the next reply once it is ready; `step_kind` says
which runs ("plain", "compiling", "compiled", "compile failed" with `compile_error`).
`compile="native"` runs the CPU step as one C++ call (tinyllm.cpu_step) from the first reply
on, with nothing to compile (step_kind "native"; a ValueError where it cannot run the model);
`compile="auto"` (what the app asks for) is "native" on a CPU where it runs the model, else
"inductor".

Contract:
- `send(text)` / `regenerate()` are generators; run them on ONE worker thread. `stop()`,
  `set_graphs(on)` and the setters may be called from any thread: they take effect between
  two tokens. Graphs toggled mid-reply change no token.
- Context full: when the next turn plus a reply reserve would not fit, the oldest whole
  turns are dropped from what the model sees (the system prompt stays), the rest is
  re-prefilled once, and Prefilled.dropped says how many messages went. `messages` still
  holds everything that was said. A single message too long for the context is a ValueError,
  and so is a system prompt that leaves no room for one: `set_system` refuses it, and where
  one came in anyway (a resumed chat, --system) each message's error names the system prompt,
  not the message.
- Errors at this boundary (bad settings, a message that cannot fit) are ValueErrors; the
  conversation is unchanged by a failed call.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import torch

from tinyllm import cpu_step
from tinyllm.background_compile import BackgroundCompile
from tinyllm.build import Progress
from tinyllm.chat_events import Finished, Message, Prefilled, StepStats, Token
from tinyllm.chat_template import ChatTemplate
from tinyllm.checkpoint import resolve_device
from tinyllm.compile_child import Spec
from tinyllm.cuda_graph import MAX_RUN, GraphDecoder
from tinyllm.model import Transformer
from tinyllm.sampling import SamplingParams
from tinyllm.step_sampler import REPEAT_WINDOW
from tinyllm.tokenizer import StreamDecoder, Tokenizer

CHUNK = MAX_RUN  # decode steps per replay (one host read per chunk)
# The context a session opens with unless asked for more: the static cache is allocated whole
# (CUDA graphs need fixed addresses), so a model's full 8,192 positions would cost SmolLM2
# 2.0 GB for "hi" where 2,048 cost 0.5 GB. `max_len` (the app's --max-len) lifts the cap.
DEFAULT_CONTEXT = 2048
IN_FLIGHT = 2  # chunks launched ahead of the host


class ChatSession:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, template: ChatTemplate,
                 max_len: int | None = None, params: SamplingParams = SamplingParams(),
                 system: str | None = None, use_graph: bool | None = None, name: str = "model",
                 compile: str | None = "inductor", chunk: int = CHUNK, threads: int | None = None,
                 source: tuple[str, str] | None = None):
        self.model, self.tokenizer, self.template, self.name = model, tokenizer, template, name
        # (path, quant) the model was opened with: on a CPU a child process then compiles the
        # step first, away from this process's GIL (tinyllm.compile_child).
        self.source = source
        self.marks: dict[str, float] = {}  # time.time() of each start-up step (see `timeline`)
        # torch's CPU thread count is per thread (OpenMP): set it in every thread that decodes.
        self.threads = (threads or default_cpu_threads()) if model.device.type == "cpu" else None
        self.graphs_available = model.device.type == "cuda"
        on = self.graphs_available if use_graph is None else use_graph and self.graphs_available
        self.decoder = GraphDecoder(model, 1, max_len=max_len, use_graph=on)
        self.decoder.sampler.n_valid = min(tokenizer.vocab_size, model.cfg.vocab_size)  # padded embeddings
        self.max_len = self.decoder.max_len
        if not 1 <= chunk <= MAX_RUN:
            raise ValueError(f"chunk must be in [1, {MAX_RUN}], got {chunk}")
        self.chunk = chunk
        self.params = params
        if compile in ("auto", "native"):  # auto: the native step where it runs this model, else Inductor's
            why = cpu_step.problem(model, 1)
            if compile == "native" and why is not None:
                raise ValueError(f"the native CPU step cannot run this model: {why}")
            compile = "native" if why is None else "inductor"
        self.native = compile == "native"
        if self.native:  # nothing to compile: the step runs as it is from the first reply on
            self.decoder.set_compile("native")
            compile = None
        if compile:
            self._capture_ahead()
        self.marks["graphs_captured"] = time.time()
        self._backend = compile
        self._compiles: list[BackgroundCompile] = []  # started so far; the last may be running
        self.compile_started = threading.Event()  # set at each start (the app's server watches it)
        if compile:
            self._start_compile(params.greedy)
        self.system = system
        self.messages: list[Message] = []
        self._stop = threading.Event()
        self._want_graphs: bool | None = None
        self.stop_ids = self._find_stop_ids()
        self.last_stats: StepStats | None = None
        self._rebuild_context()

    @property
    def device(self) -> str:
        return self.model.device.type

    @property
    def model_max_len(self) -> int:
        """The model's own context (max_len may be less: see DEFAULT_CONTEXT)."""
        return self.model.cfg.max_seq_len

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    @property
    def _compile(self) -> BackgroundCompile | None:
        return self._compiles[-1] if self._compiles else None

    def _start_compile(self, greedy: bool) -> None:
        child = None
        if self.source is not None and self.device == "cpu":
            child = Spec(self.source[0], "cpu", self.source[1], self.max_len, self.threads,
                         self.decoder.sampler.n_valid, greedy, self._backend)
        self._compiles.append(BackgroundCompile(self.model, 1, self.max_len, self._backend, self.threads,
                                                self.decoder.sampler.n_valid, greedy=greedy, child=child))
        self.compile_started.set()

    def _compiled_variants(self) -> set[bool]:
        return {c.greedy for c in self._compiles if c.state == "compiled"}

    @property
    def step_kind(self) -> str:
        """The step the next reply runs: "plain" (no compile asked), "compiling" (a compile
        runs, or the settings' sampler variant is not compiled yet), "compiled", or "compile
        failed" (see compile_error; the plain step stays)."""
        if self.native:
            return "native"
        c = self._compile
        if c is None:
            return "plain"
        if c.state == "compiling":
            return "compiling"
        if self.params.greedy in self._compiled_variants():
            return "compiled"
        return "compile failed" if c.state == "failed" else "compiling"

    def _step_running(self) -> str:
        """The step the current reply runs (the compiled one takes over between replies)."""
        if self.decoder.compile:
            return "native" if self.native else "compiled"
        kind = self.step_kind
        return "compiling" if kind == "compiled" else kind

    @property
    def compile_error(self) -> str:
        return self._compile.error if self._compile is not None else ""

    @property
    def timeline(self) -> dict[str, float]:
        """time.time() of each start-up step so far: those in `marks` (open_session adds
        "open_started" and "model_loaded", the app's child process its own) and "compiled"
        once the background compile has ended."""
        done = self._compiles[0].done_at if self._compiles else 0.0
        return dict(self.marks, **({"compiled": done} if done else {}))

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the running background compile is over (compiled or failed); False on timeout."""
        return self._compile is None or self._compile.wait(timeout)

    def _capture_ahead(self) -> None:
        """Before the background compile starts: capture the plain step's graphs (every bucket,
        runs of 1 and of `chunk` steps, the settings' sampler variant) and run one prefill, so
        its kernels are loaded. Captured during the compile, each graph would wait for the GIL
        behind the compiler (measured on the H200: 35-51 tok/s for the first reply instead of
        ~1,500), and a capture beside the compiler's own CUDA work can break either."""
        dec = self.decoder
        if not dec.use_graph:
            return
        n = max(1, min(48, self.max_len // 4))
        dec.append(torch.full((1, n), self.tokenizer.bos_id, device=self.model.device))  # allocates the cache
        dec.truncate(1)
        dec.sampler.greedy = self.params.greedy
        self._capture_runs()
        dec.truncate(0)

    def _capture_runs(self) -> None:
        """Capture the current step's graphs for every bucket and both run lengths (1 and
        `chunk`: `run_length`) that fit from the current position."""
        dec = self.decoder
        for steps in sorted({1, self.chunk}):
            if dec.n + steps <= self.max_len:
                dec.capture(steps=steps)

    def _compiling(self) -> bool:
        return self._compile is not None and not self._compile.ready.is_set()

    def prepare(self) -> None:
        """Between replies, on the worker thread (the app's server calls it as soon as a compile
        ends; a reply calls it at its start): run the compiled step if the settings' sampler
        variant is compiled and no compile is running (see background_compile's contract), and
        capture its graphs ahead, so the next reply neither waits for them nor runs slower while
        they are captured one by one (measured on the H200: the first replies on the compiled
        step ran at 490-750 tok/s, the third at 660-970). A variant not compiled yet starts
        compiling now, once, and the plain step runs meanwhile: a compile never sits on a
        reply's path."""
        c = self._compile
        if c is None:
            return
        greedy = self.params.greedy
        idle = c.ready.is_set()
        if idle and c.state == "compiled" and greedy not in self._compiled_variants():
            self._start_compile(greedy)
            idle = False
        use = idle and greedy in self._compiled_variants()
        # the variant's compiled step as loaded or saved (CPU sessions), where it was
        saved = next((c.saved for c in self._compiles if c.state == "compiled" and c.greedy == greedy),
                     None) if use else None
        if use != bool(self.decoder.compile) or saved is not self.decoder.saved:
            self.decoder.set_compile(self._backend if use else None, saved)
        if use and self.decoder.use_graph:
            self.decoder.sampler.greedy = greedy
            self._capture_runs()  # those already there are kept

    # ---- settings (any thread) -------------------------------------------------------

    @property
    def use_graph(self) -> bool:
        want = self._want_graphs
        return self.decoder.use_graph if want is None else want

    def set_graphs(self, on: bool) -> None:
        """Graphs on/off from the next step on. On a CPU: ValueError."""
        if on and not self.graphs_available:
            raise ValueError("CUDA graphs are not available on the CPU")
        self._want_graphs = on

    def stop(self) -> None:
        """Ask the running reply to finish after the current token."""
        self._stop.set()

    def set_param(self, name: str, value: str) -> None:
        self.params = self.params.with_value(name, value)

    def set_system(self, text: str | None) -> None:
        """A new system prompt; the conversation's context is rebuilt (next turn re-prefills).
        ValueError, changing nothing, for one that leaves no room for a message and its reply."""
        old, self.system = self.system, text or None
        reserve = min(self.params.max_tokens, self.max_len // 4)
        system = self._system_tokens()
        if system and len(self._head_ids()) + reserve + (system if self.template.system_in_first_user else 0) \
                >= self.max_len:
            self.system = old
            raise ValueError(self._system_too_long(system, reserve))
        self._rebuild_context()

    def new_chat(self) -> None:
        self.messages = []
        self._rebuild_context()

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        """Restore a conversation (resume): (role, content) pairs, re-encoded. A user turn
        followed by another (a crash before its reply began) gets an empty stopped reply, so
        turns alternate. A last user turn stays as it is: the context ends ready for its
        reply, which regenerate() generates."""
        self.messages = []
        for role, content in messages:
            if role == "system":
                self.system = content
            elif role == "user":
                if self.messages and self.messages[-1].role == "user":
                    self.messages.append(self._loaded_reply("", stopped=True))
                self.messages.append(Message("user", content, self._user_ids(content, len(self.messages) == 0)))
            else:
                self.messages.append(self._loaded_reply(content))
        self._rebuild_context()

    def _loaded_reply(self, content: str, stopped: bool = False) -> Message:
        ids = self.encode(content) + self.encode(self.template.assistant_suffix)
        return Message("assistant", content, ids, stopped=stopped)

    # ---- tokens -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Encode text, mapping literal "<s>" / "</s>" to BOS / EOS (templates use them)."""
        ids: list[int] = []
        specials = {"<s>": self.tokenizer.bos_id, "</s>": self.tokenizer.eos_id}
        rest = text
        while rest:
            hits = [(rest.find(s), s) for s in specials if s in rest]
            if not hits:
                ids += self.tokenizer.encode(rest)
                break
            at, s = min(hits)
            if at:
                ids += self.tokenizer.encode(rest[:at])
            ids.append(specials[s])
            rest = rest[at + len(s):]
        return ids

    def _find_stop_ids(self) -> set[int]:
        stops = {self.tokenizer.eos_id}
        for piece in self.template.stop:
            i = self.tokenizer.piece_to_id(piece)
            if i is not None:
                stops.add(i)
        return stops

    def _user_ids(self, content: str, first: bool) -> list[int]:
        system = self.system if first else None
        return self.encode(self.template.render_user(content, system) + self.template.assistant_prefix)

    def _head_ids(self) -> list[int]:
        ids = [self.tokenizer.bos_id] if self.template.bos else []
        if self.system and not self.template.system_in_first_user:
            ids += self.encode(self.template.render_system(self.system))
        return ids

    # ---- the context ------------------------------------------------------------------

    def _rebuild_context(self, first: int = 0) -> None:
        """The ids the model sees: head + messages[first:]. The cache is rewound to the
        longest prefix it already holds; the next prefill appends the rest."""
        ids = self._head_ids()
        for i, m in enumerate(self.messages[first:]):
            if m.role == "user" and i == 0 and self.template.system_in_first_user:
                ids += self._user_ids(m.content, True)
            else:
                ids += m.ids
        old = getattr(self, "context", [])
        keep = 0
        for a, b in zip(old[:self.decoder.n], ids, strict=False):
            if a != b:
                break
            keep += 1
        self.decoder.truncate(max(0, min(keep, len(ids) - 1)))  # a reply needs >= 1 id to prefill
        self.context, self.first_message = ids, first

    def _fit(self, extra: int) -> int:
        """Drop the oldest whole turns until context + extra + a reply reserve fits.
        Returns how many messages were dropped."""
        reserve = min(self.params.max_tokens, self.max_len // 4)
        head = len(self._head_ids())
        if head + extra + reserve > self.max_len:
            system = self._system_tokens()
            if system and head + extra + reserve - system <= self.max_len:  # the message alone fits
                raise ValueError(self._system_too_long(system, reserve))
            raise ValueError(f"message too long: {extra} tokens, and the context holds {self.max_len} "
                             f"(with {reserve} kept for the reply); shorten it or raise --max-len")
        if len(self.context) + extra + reserve <= self.max_len:
            return 0
        # Trim to 3/4 of the context, so the next turns fit without another re-prefill.
        target = max(self.max_len * 3 // 4, head + extra + reserve)
        start = first = self.first_message
        while len(self.context) + extra + reserve > target and first < len(self.messages):
            first += 1
            while first < len(self.messages) and self.messages[first].role != "user":
                first += 1  # a turn starts at a user message
            self._rebuild_context(first)
        return first - start

    def _system_tokens(self) -> int:
        """How many ids the system prompt adds to the context (0 without one)."""
        if not self.system:
            return 0
        if self.template.system_in_first_user:
            return len(self.encode(self.template.render_user("", self.system))) - len(
                self.encode(self.template.render_user("", None)))
        return len(self.encode(self.template.render_system(self.system)))

    def _system_too_long(self, system: int, reserve: int) -> str:
        return (f"the system prompt is too long: {system} tokens, and the context holds {self.max_len} "
                f"(with {reserve} kept for the reply); shorten it (/system TEXT) or raise --max-len")

    # ---- replies (worker thread) ------------------------------------------------------

    def send(self, text: str) -> Iterator[Prefilled | Token | Finished]:
        """Add a user turn and stream the reply. All or nothing: if the reply fails before its
        first event, the user turn is taken back (and any turns dropped to make room return)."""
        if not text.strip():
            raise ValueError("empty message")
        first = self.first_message >= len(self.messages)  # no earlier turn in the context
        ids = self._user_ids(text, first)
        was_first = self.first_message
        dropped = self._fit(len(ids))
        self.messages.append(Message("user", text, ids))
        self.context = self.context + ids

        def undo() -> None:
            self.messages.pop()
            self._rebuild_context(was_first)

        return self._or_restore(self._reply(dropped), undo)

    def regenerate(self) -> Iterator[Prefilled | Token | Finished]:
        """Replace the last reply with a new one (the cache is rewound to before it); after a
        last user turn with no reply (a resumed chat), generate its reply. All or nothing: if
        the new reply fails before its first event, the old one is put back."""
        if not self.messages:
            raise ValueError("there is no reply to regenerate")
        if self.messages[-1].role == "user":
            return self._reply(0)
        old = self.messages.pop()
        self._rebuild_context(self.first_message)

        def undo() -> None:
            self.messages.append(old)
            self._rebuild_context(self.first_message)

        return self._or_restore(self._reply(0), undo)

    def continue_reply(self) -> Iterator[Prefilled | Token | Finished]:
        """Extend the last reply from where it ended (a limit, Esc, a full context): the model
        sees the reply without its closing suffix and goes on. Its Finished carries the whole
        reply's text, and the conversation keeps ONE assistant message. All or nothing, like
        regenerate()."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise ValueError("there is no reply to continue")
        old = self.messages[-1]
        suffix = self.encode(self.template.assistant_suffix)
        body = old.ids[:len(old.ids) - len(suffix)] if suffix and old.ids[-len(suffix):] == suffix else old.ids
        if len(self.context) - len(old.ids) + len(body) + 1 >= self.max_len:
            raise ValueError("the context is full: the reply cannot go on (start a new chat, or raise --max-len)")
        self.messages.pop()
        self._rebuild_context(self.first_message)
        self.context = self.context + body

        def undo() -> None:
            self.messages.append(old)
            self._rebuild_context(self.first_message)

        return self._joined(old, body, self._or_restore(self._reply(0), undo))

    def _joined(self, old: Message, body: list[int],
                events: Iterator[Prefilled | Token | Finished]) -> Iterator[Prefilled | Token | Finished]:
        """The continued reply's events; at its end, the old and the new part become one message."""
        for event in events:
            if isinstance(event, Finished):
                new = self.messages.pop()
                text = old.content + new.content
                self.messages.append(Message("assistant", text, body + new.ids, stopped=new.stopped))
                event = Finished(event.reason, text, event.stats)
            yield event

    def _or_restore(self, events: Iterator[Prefilled | Token | Finished],
                    undo: Callable[[], None]) -> Iterator[Prefilled | Token | Finished]:
        """The events; if they fail before the first one, undo() puts the session back."""
        started = False
        try:
            for event in events:
                started = True
                yield event
        except BaseException:
            if not started:
                undo()
            raise

    def _apply_graph_toggle(self) -> None:
        if self._want_graphs is not None:
            self.decoder.use_graph, self._want_graphs = self._want_graphs, None

    def _reply(self, dropped: int) -> Iterator[Prefilled | Token | Finished]:
        if self.threads:
            torch.set_num_threads(self.threads)
        self.prepare()
        dec, params = self.decoder, self.params
        t0 = time.perf_counter()
        with self._compile.paused() if self._compiling() else nullcontext():  # see BackgroundCompile
            new = torch.tensor([self.context[dec.n:]], dtype=torch.long, device=self.model.device)
            logits = dec.append(new)[:, -1]  # (1, V)
            recent = torch.tensor([self.context[-REPEAT_WINDOW:]], dtype=torch.long, device=self.model.device)
            dec.sampler.load(params, recent)
            first = dec.sampler.draw(logits)  # (1,): the draw the steps would make, eagerly
            dec.tok.copy_(first[:, None])
            tok_id = int(first.item())
        ttft = (time.perf_counter() - t0) * 1000
        yield Prefilled(n_tokens=new.shape[1], ms=ttft, dropped=dropped)
        stream = StreamDecoder(self.tokenizer)
        n0 = dec.n  # the cache holds the context; each step feeds one reply id
        out_ids: list[int] = []
        text_parts: list[str] = []
        t_decode = time.perf_counter()
        reason = "max_tokens"
        ahead: deque[int] = deque([tok_id])  # drawn, not yet looked at
        chunks = deque()  # launched, not yet read
        while True:
            if not ahead:
                self._launch(chunks, n0)
                ahead.extend(chunks.popleft().ids()[0])
            tok_id = ahead.popleft()
            if tok_id in self.stop_ids:
                reason = "eos"
                break
            out_ids.append(tok_id)
            piece = stream.push(tok_id)
            text_parts.append(piece)
            yield Token(piece, self._stats(len(out_ids), n0 + len(out_ids) - 1, t_decode, ttft))
            if self._stop.is_set():
                reason = "stopped"
                break
            if len(out_ids) >= params.max_tokens:
                break
            if n0 + len(out_ids) - 1 >= self.max_len:
                reason = "context_full"
                break
        # The cache keeps what a token-by-token run feeds: every reply id but the last, and
        # the last too when a stop id came after it. Chunks past that are rewound.
        fed = len(out_ids) if reason == "eos" else max(len(out_ids) - 1, 0)
        dec.truncate(n0 + fed)
        tail = stream.flush()
        text_parts.append(tail)
        text = "".join(text_parts)
        # The reply's last sampled id (a stop id or the one past the limit) is not in the
        # cache: the context holds exactly what was fed, and the suffix closes the turn.
        ids = out_ids + self.encode(self.template.assistant_suffix)
        self.messages.append(Message("assistant", text, ids, stopped=reason == "stopped"))
        self.context = self.context + ids
        stats = self._stats(len(out_ids), n0 + fed, t_decode, ttft)
        self.last_stats = stats
        self._stop.clear()  # a stop() that came before this reply began still stopped it
        if tail:
            yield Token(tail, stats)
        yield Finished(reason, text, stats)

    def _launch(self, chunks: deque, n0: int) -> None:
        """Launch chunks until IN_FLIGHT are queued (at least one). A chunk never runs past the
        token limit, the context or its bucket; the first id of the reply came from prefill."""
        dec = self.decoder
        while len(chunks) < IN_FLIGHT:
            steps_left = self.params.max_tokens - 1 - (dec.n - n0)  # ids the reply may still draw
            room = self.max_len - dec.n
            if (steps_left <= 0 or room <= 0) and chunks:
                return
            assert steps_left > 0 and room > 0, "launch asked past the reply's end"
            self._apply_graph_toggle()
            to_bucket = dec.bucket(dec.n + 1) - dec.n  # steps left in this bucket
            # No capture while a compile runs (see _capture_ahead): a run with no graph yet (the
            # other sampler variant's) runs eagerly then, the same steps bit for bit.
            chunks.append(dec.launch(run_length(min(steps_left, room, to_bucket), self.chunk),
                                     capture=not self._compiling()))

    def _stats(self, n: int, position: int, t_decode: float, ttft: float) -> StepStats:
        dt = time.perf_counter() - t_decode
        return StepStats(window=self.decoder.window or 0, position=position, max_len=self.max_len,
                         tokens=n, tok_per_s=(n - 1) / dt if n > 1 and dt > 0 else 0.0, ttft_ms=ttft,
                         graphs=self.decoder.use_graph if self.graphs_available else None, step=self._step_running())


def run_length(fits: int, chunk: int) -> int:
    """Steps of the next run: a whole chunk where it fits, else one. Each run length is a graph
    of its own per bucket and sampler variant, and these two are captured ahead
    (`ChatSession._capture_runs`), so no graph is ever captured mid-reply: with any length up to
    `fits`, and then with powers of two, the ends of replies and buckets captured new ones,
    and the replies' tok/s rose reply by reply (H200: 1.1B shape 493, 559, 662). The single
    steps at a bucket's end cost little: the GPU stays busy with two runs in flight."""
    return chunk if fits >= chunk else 1


def default_cpu_threads() -> int:
    """Torch threads for decoding on a CPU: one per core this process may use, less one for
    the UI and the rest of the machine, at most 8 (docs/INFERENCE.md, "CPU threads")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores - 1))


def open_session(path: str | Path, device: str = "auto", max_len: int | None = None,
                 params: SamplingParams = SamplingParams(), system: str | None = None,
                 use_graph: bool | None = None, template: str | None = None,
                 compile: str | None = "inductor", threads: int | None = None,
                 quant: str = "none", progress: Progress | None = None) -> ChatSession:
    """Open a model (tinyllm checkpoint folder, Hugging Face folder or .gguf file; see
    tinyllm.open_model) in a ChatSession, its matrices held as `quant` says (tinyllm.build).
    On a CPU, torch uses `threads` threads (default: default_cpu_threads()). Without a system
    prompt, the model's own default one (what its Jinja chat template writes when there is
    none) is used. `progress(done, total)` hears each tensor read (tinyllm.build.with_progress)."""
    from tinyllm.open_model import open_any

    started = time.time()
    dev = resolve_device(device)
    if dev.type == "cpu":
        torch.set_num_threads(threads or default_cpu_threads())  # for loading; replies set it again
    model, tokenizer, chat_template, name = open_any(path, dev, template=template, quant=quant, progress=progress)
    loaded = time.time()
    if system is None:
        system = getattr(chat_template, "default_system", None)
    max_len = min(max_len or DEFAULT_CONTEXT, model.cfg.max_seq_len)
    session = ChatSession(model, tokenizer, chat_template, max_len=max_len, params=params,
                          system=system, use_graph=use_graph, name=name, compile=compile, threads=threads,
                          source=(os.path.abspath(path), quant))
    session.marks.update(open_started=started, model_loaded=loaded)
    return session
