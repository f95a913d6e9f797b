"""The teacher: many chat prompts through one `Engine`, each with its own seed.

Contract:
- `Teacher(path, device, n_slots=64, max_len=1024, compile=None)` opens the model (`open_any`),
  `Teacher.chat(jobs, params, seed) -> list[Reply]` renders each job (a list of
  {"role", "content"} messages ending with a user turn; no system message: the template's
  default one is NOT added) with the model's chat template as ChatSession encodes it, runs
  them all, and returns each reply's text, token count and whether it ended on a stop id.
  Job i samples with `params` and the seed `job_seed(seed, i)`: the engine samples each row
  inside its step with its own noise (tinyllm.decode.row_sampler), so a reply depends on its
  job, the seed and i, not on which jobs share its batch (to the float rounding of the
  batch's kernels). Jobs whose prompt leaves fewer than 16 tokens for a reply come back
  empty, unfinished. `prefills` start replies (a numbered list's "1.").
- One engine for the teacher's life (n_slots rows, min_admit n_slots // 8: admissions, each
  an eager prefill, come in groups rather than one per finished request). `submit(messages,
  params, seed, prefill) -> request id` and `reply(rid, prefill) -> Reply` are chat's two
  halves, for a caller that steps the engine itself (tinyllm.tools.datagen.stream);
  `add_time(t0)` counts the time since t0 in stats.
- `Teacher.stats` counts generated tokens and seconds spent in the engine, and where those
  seconds went (tinyllm.decode.engine's EngineStats): decode steps, the live rows they carried
  (`occupancy`: rows per step over n_slots), admissions (`admit_s`) and the time spent waiting
  for the GPU (`wait_s`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace

import torch

from tinyllm.decode.engine import Engine
from tinyllm.decode.sampling import SamplingParams
from tinyllm.tools.data import render_segments


def job_seed(seed: int, i: int) -> int:
    """Job i's sampling seed in a call seeded `seed` (a 63-bit hash of both)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class Reply:
    text: str
    n_tokens: int
    finished: bool  # ended on a stop id (not cut by the token limit or the context)


@dataclass
class TeacherStats:
    tokens: int = 0  # generated
    seconds: float = 0.0  # in the engine
    requests: int = 0
    steps: int = 0  # decode steps
    occupancy: float = 0.0  # live rows per step / n_slots
    decode_s: float = 0.0  # in the engine's steps, admissions excluded
    admit_s: float = 0.0
    wait_s: float = 0.0  # waiting for the GPU's reports

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def timing(self) -> dict:
        """For a round's log line: where the engine's time went."""
        return {"steps": self.steps, "occupancy": round(self.occupancy, 3),
                "ms_per_step": round(1000 * self.decode_s / max(self.steps, 1), 2),
                "decode_s": round(self.decode_s, 1), "admit_s": round(self.admit_s, 1),
                "wait_s": round(self.wait_s, 1), "engine_s": round(self.seconds, 1)}

    def take(self, engine: Engine) -> None:
        """The engine's counts so far (it lives as long as the teacher)."""
        st = engine.stats
        self.steps, self.admit_s, self.wait_s = st.steps, st.admit_s, st.wait_s
        self.decode_s = st.step_s - st.admit_s
        self.occupancy = st.occupancy(engine.n_slots)


class Teacher:
    def __init__(self, path: str, device: str = "cpu", n_slots: int = 64, max_len: int = 1024,
                 compile: str | None = None, model=None, tokenizer=None, template=None):
        if model is None:
            from tinyllm.formats.open_model import open_any

            model, tokenizer, template, _ = open_any(path, device, quant="none")  # dense: the reference
        self.model, self.tok, self.template = model, tokenizer, template
        self.n_slots, self.compile = n_slots, compile
        self.max_len = min(max_len, model.cfg.max_seq_len)
        stops = {tokenizer.eos_id} | {tokenizer.piece_to_id(s) for s in template.stop}
        self.stop_ids = sorted(i for i in stops if i is not None)
        self.stats = TeacherStats()
        self._engine: Engine | None = None

    def encode(self, messages: list[dict]) -> list[int]:
        """Prompt ids as ChatSession builds them: BOS (if the template wants it), then each
        rendered segment encoded alone, ending with the assistant prefix."""
        assert messages and messages[-1]["role"] == "user", "a job ends with a user turn"
        ids = [self.tok.bos_id] if self.template.bos and self.tok.bos_id is not None else []
        for text, _ in render_segments(messages, self.template):
            ids += self.tok.encode(text)
        return ids

    def count(self, text: str) -> int:
        return len(self.tok.encode(text))

    def engine(self) -> Engine:
        """One engine for the teacher's life: a compiled step and its graphs are made once."""
        if self._engine is None:
            self._engine = Engine(self.model, self.n_slots, max_len=self.max_len, compile=self.compile,
                                  min_admit=max(1, self.n_slots // 8), token_events=False)
        return self._engine

    def submit(self, messages: list[dict], params: SamplingParams, seed: int, prefill: str = "") -> int | None:
        """Queue one job (see chat); its request id, or None where its prompt leaves no room."""
        ids = self.encode(messages) + (self.tok.encode(prefill) if prefill else [])
        room = self.max_len - len(ids)
        if room < 16:
            return None
        return self.engine().add_request(ids, replace(params, max_tokens=min(params.max_tokens, room), seed=seed),
                                         self.stop_ids)

    def reply(self, rid: int | None, prefill: str = "") -> Reply:
        """A finished request's Reply (prefill first), counted in stats; its record is dropped."""
        self.stats.requests += 1
        if rid is None:
            return Reply("", 0, False)
        engine = self.engine()
        toks, finished = engine.result(rid), engine.finish_reason(rid) == "stop"
        del engine.requests[rid]
        self.stats.tokens += len(toks)
        return Reply((prefill + self.tok.decode(toks[:-1] if finished else toks)).strip(), len(toks), finished)

    def chat(self, jobs: list[list[dict]], params: SamplingParams, seed: int,
             prefills: list[str] | None = None) -> list[Reply]:
        """Replies to every job, in order (see the module docstring). prefills[i], when given,
        starts job i's reply (encoded after the assistant prefix; "1." makes the teacher
        write a numbered list it would otherwise not write) and begins its Reply.text."""
        if not jobs:
            return []
        t0 = time.perf_counter()
        prefills = prefills or [""] * len(jobs)
        rids = [self.submit(msgs, params, job_seed(seed, i), pre)
                for i, (msgs, pre) in enumerate(zip(jobs, prefills, strict=True))]
        engine = self.engine()
        engine.run_until_done()
        out = [self.reply(rid, pre) for rid, pre in zip(rids, prefills, strict=True)]
        self.add_time(t0)
        return out

    def add_time(self, t0: float) -> None:
        """Count the engine time since t0 (perf_counter) in stats, and take its counts."""
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.stats.seconds += time.perf_counter() - t0
        self.stats.take(self.engine())
