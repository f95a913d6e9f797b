"""DecodeRunner: one reply's decoding, from the prefill of the new ids to the last token.

It owns a `GraphDecoder` (its `StaticKVCache` and `StepSampler`) and drives it through its
public methods only. `reply(context, params, dropped, policy, record)` streams the events:

  Prefilled(n_tokens, ms, dropped)      once: the ids of `context` past the cache are prefilled
  Token(text, stats)                    one per generated token (text may be "")
  Finished(reason, text, stats)         reason: "eos" | "max_tokens" | "stopped" | "context_full"
                                        | "repeating"

Decoding: the sampler runs inside the decode step (seeded noise); the first id is drawn
eagerly from the prefill's logits, as a step would draw it. The decoder runs `chunk` steps per
replay, launched ahead of the one being read (at most IN_FLIGHT in flight on CUDA, one at a time
of CPU_CHUNK steps on a CPU, where a launch runs before it returns): the host reads ids once
per chunk, never once per token. A reply that ends inside a chunk (a stop id, `stop()`,
the token limit, the context's end) rewinds the cache to exactly what a token-by-token run
holds: every reply id but the last, and the last too when a stop id came after it. A run
never crosses a bucket boundary, and is a whole chunk or one step (`run_length`), so chunked
and token-by-token decoding are the same steps, bit for bit, and every run's graph is one
captured ahead. The repetition stop (params.repeat_stop > 0): once per chunk read, the reply's
ids with the chunk's are looked at for a tail that says one span repeat_stop times
(tinyllm.decode.loops.RepeatWatch), and the reply ends "repeating" at the first id where it
does, as a stop id would end it there; Ctrl+F (continue) goes on from there, and the
continued part is looked at alone. DRY's breakers are the tokenizer's (loops.breaker_ids), set
once. `record(ids, text, reason)` hears the reply (the ids fed of it) before its last
events, so the conversation holds it when Finished arrives.

The step policy (tinyllm.session.step_policy) is asked at the reply's start to `prepare` the step,
over the whole reply to keep a running compile `paused` (a `beat` each chunk read: the reply
goes on), before each launch whether a compile runs (then nothing is captured: a run with no
graph runs eagerly, the same steps bit for bit), and for the stats' step kind. The settings are
read once, at the reply's start.

`stop()`, `set_graphs(on)` and `stop_ids` may be set from any thread: they take effect between
two tokens. Graphs toggled mid-reply change no token. `set_graphs(True)` on a CPU is a ValueError
(there the session's switch turns the native step on and off: StepPolicy.set_native, applied
before each launch too).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import torch

from tinyllm.cuda_graph import MAX_RUN, Chunk, GraphDecoder
from tinyllm.decode.loops import RepeatWatch, breaker_ids
from tinyllm.decode.sampling import SamplingParams
from tinyllm.decode.sampling_params import DRY_WINDOW
from tinyllm.decode.step_sampler import REPEAT_WINDOW
from tinyllm.model import Transformer
from tinyllm.session.chat_events import Finished, Prefilled, StepStats, Token
from tinyllm.session.step_policy import StepPolicy
from tinyllm.text.tokenizer import StreamDecoder, Tokenizer

CHUNK = MAX_RUN  # decode steps per replay (one host read per chunk)
IN_FLIGHT = 2  # chunks launched ahead of the host (CUDA: a launch returns before its steps run)
# On a CPU a launch runs its steps before it returns, so nothing overlaps: one chunk at a time,
# of CPU_CHUNK steps. Measured on the default model (native step, 1 thread, the 2-core CPU, the
# repetition stop on, 512-token replies; docs/BENCHMARKS.md, 2026-12-06): in flight 2 x 16
# steps showed the reply's second token 316 ms after its first and then 16 at a time (88.8-90.3
# tok/s); 1 x 4: 39-40 ms, then 4 at a time (86.1-88.6); 1 x 1: 10 ms, but the repetition
# check once a chunk cost 10% (77.6-80.6). A 0.5B model at 18 tok/s waited 1.7 s for its second.
CPU_CHUNK = 4


class DecodeRunner:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_len: int | None, use_graph: bool | None,
                 chunk: int = CHUNK, threads: int | None = None, stop_ids: set[int] | None = None):
        """use_graph None: graphs where the model is on CUDA (never elsewhere). `threads`: torch's
        CPU threads, set in the thread that decodes (OpenMP's count is per thread)."""
        self.tokenizer, self.threads = tokenizer, threads
        self.graphs_available = model.device.type == "cuda"
        on = self.graphs_available if use_graph is None else use_graph and self.graphs_available
        n_valid = min(tokenizer.vocab_size, model.cfg.vocab_size)  # padded embeddings: never drawn
        self.decoder = GraphDecoder(model, 1, max_len=max_len, use_graph=on, n_valid=n_valid)
        self.max_len = self.decoder.max_len
        self.decoder.sampler.set_breakers(breaker_ids(tokenizer))  # DRY's (0.1 s for 16k ids, 0.3 s for 49k)
        if not 1 <= chunk <= MAX_RUN:
            raise ValueError(f"chunk must be in [1, {MAX_RUN}], got {chunk}")
        self.chunk = chunk
        self.in_flight = IN_FLIGHT if model.device.type == "cuda" else 1
        self.stop_ids = stop_ids or set()
        self.last_stats: StepStats | None = None
        self._stop = threading.Event()
        self._want_graphs: bool | None = None

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

    def _apply_graph_toggle(self) -> None:
        if self._want_graphs is not None:
            self.decoder.use_graph, self._want_graphs = self._want_graphs, None

    # ---- a reply (worker thread) -----------------------------------------------------

    def reply(self, context: list[int], params: SamplingParams, dropped: int, policy: StepPolicy,
              record: Callable[[list[int], str, str], None]) -> Iterator[Prefilled | Token | Finished]:
        """The reply to `context` (its ids past the cache are prefilled); `dropped` goes into
        Prefilled. See the module docstring."""
        if self.threads:
            torch.set_num_threads(self.threads)
        t0 = time.perf_counter()  # the time to the first token counts prepare's captures too
        policy.prepare(params.greedy, self.chunk, params.filtered)
        with policy.paused():  # a running compile waits for the reply's end (BackgroundCompile)
            yield from self._reply(context, params, dropped, policy, record, t0)

    def _reply(self, context: list[int], params: SamplingParams, dropped: int, policy: StepPolicy,
               record: Callable[[list[int], str, str], None], t0: float) -> Iterator[Prefilled | Token | Finished]:
        dec, device = self.decoder, self.decoder.model.device
        new = torch.tensor([context[dec.n:]], dtype=torch.long, device=device)  # (1, T)
        logits = dec.append(new)[:, -1]  # (1, V)
        recent = torch.tensor([context[-max(REPEAT_WINDOW, DRY_WINDOW):]], dtype=torch.long, device=device)
        tok_id = int(dec.draw_first(logits, params, recent).item())  # the draw the steps would make
        ttft = (time.perf_counter() - t0) * 1000
        yield Prefilled(n_tokens=new.shape[1], ms=ttft, dropped=dropped)
        stream = StreamDecoder(self.tokenizer)
        n0 = dec.n  # the cache holds the context; each step feeds one reply id
        out_ids: list[int] = []
        text_parts: list[str] = []
        t_decode = time.perf_counter()
        reason = "max_tokens"
        ahead: deque[int] = deque([tok_id])  # drawn, not yet looked at
        chunks: deque[Chunk] = deque()  # launched, not yet read
        repeats_at = None  # the reply's length at which its tail repeats (params.repeat_stop)
        watch = RepeatWatch(params.repeat_stop)  # every id of the reply, pushed once, in order
        while True:
            if not ahead:
                self._launch(chunks, n0, params.max_tokens, policy)
                ahead.extend(chunks.popleft().ids()[0])
                policy.beat()
                if params.repeat_stop and repeats_at is None:  # once a chunk: ends in it, before any is shown
                    repeats_at = watch.push(out_ids[watch.n:] + list(ahead))
            tok_id = ahead.popleft()
            if tok_id in self.stop_ids:
                reason = "eos"
                break
            out_ids.append(tok_id)
            piece = stream.push(tok_id)
            text_parts.append(piece)
            yield Token(piece, self._stats(len(out_ids), n0 + len(out_ids) - 1, t_decode, ttft, policy, params))
            if self._stop.is_set():
                reason = "stopped"
                break
            if repeats_at is not None and len(out_ids) >= repeats_at:
                reason = "repeating"
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
        record(out_ids, text, reason)
        stats = self._stats(len(out_ids), n0 + fed, t_decode, ttft, policy, params)
        self.last_stats = stats
        self._stop.clear()  # a stop() that came before this reply began still stopped it
        if tail:
            yield Token(tail, stats)
        yield Finished(reason, text, stats)

    def _launch(self, chunks: deque[Chunk], n0: int, max_tokens: int, policy: StepPolicy) -> None:
        """Launch chunks until `in_flight` are queued (at least one). A chunk never runs past the
        token limit, the context or its bucket; the first id of the reply came from prefill."""
        dec = self.decoder
        while len(chunks) < self.in_flight:
            steps_left = max_tokens - 1 - (dec.n - n0)  # ids the reply may still draw
            room = self.max_len - dec.n
            if (steps_left <= 0 or room <= 0) and chunks:
                return
            assert steps_left > 0 and room > 0, "launch asked past the reply's end"
            self._apply_graph_toggle()
            policy.apply()  # the native step on or off (StepPolicy.set_native), as graphs
            to_bucket = dec.bucket(dec.n + 1) - dec.n  # steps left in this bucket
            # No capture while a compile runs (step_policy): a run with no graph yet (the other
            # sampler variant's) runs eagerly then, the same steps bit for bit.
            chunks.append(dec.launch(run_length(min(steps_left, room, to_bucket), self.chunk),
                                     capture=not policy.compiling()))

    def _stats(self, n: int, position: int, t_decode: float, ttft: float, policy: StepPolicy,
               params: SamplingParams) -> StepStats:
        dt = time.perf_counter() - t_decode
        return StepStats(window=self.decoder.window or 0, position=position, max_len=self.max_len,
                         tokens=n, tok_per_s=(n - 1) / dt if n > 1 and dt > 0 else 0.0, ttft_ms=ttft,
                         graphs=self.decoder.use_graph if self.graphs_available else None,
                         step=policy.step_running(params.greedy))


def run_length(fits: int, chunk: int) -> int:
    """Steps of the next run: a whole chunk where it fits, else one. Each run length is a graph
    of its own per bucket and sampler variant, and these two are captured ahead
    (`StepPolicy.capture_ahead` and `prepare`), so no graph is ever captured mid-reply: with
    any length up to `fits`, and then with powers of two, the ends of replies and buckets
    captured new ones, and the replies' tok/s rose reply by reply (H200: 1.1B shape 493, 559,
    662). The single steps at a bucket's end cost little: the GPU stays busy with two runs in
    flight."""
    return chunk if fits >= chunk else 1
