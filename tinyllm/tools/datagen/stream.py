"""Rounds side by side through one engine: the teacher's engine never drains between stages.

Contract:
- `stream_rounds(teacher, start(r), first, in_flight, more()) -> iterator of (r, result)`:
  rounds first, first + 1, ... each a generator made by `start(r)` (rounds.round_steps: it
  yields the `Ask`s it waits on, is sent their replies, returns its result). Up to
  `in_flight` rounds run at once: every job of each round's current Ask is queued in the
  teacher's one engine (`Teacher.submit`, job i seeded `job_seed(ask.seed, i)`, as
  `Teacher.chat` seeds it), and the moment an Ask's last request ends its round is sent the
  replies and its next Ask's jobs join the engine, while the other rounds' requests run on.
  A new round starts (when `more()` says so) as soon as fewer than `in_flight` run. Results
  come out in round order.
- A round's replies do not depend on which other requests share the engine (the engine
  samples each row with its own noise), so a round's text is that of `rounds.run_round` on
  the same filters' state. What interleaving changes is that state: a round's dedup sees
  what the rounds before it had kept when it judged. Deterministic for the same teacher,
  flags and device. The time spent is added to `teacher.stats` (as `Teacher.chat` adds it).
Why: one `chat` call at a time drains the engine before each stage (a tail of up to a whole
reply's steps at falling occupancy), and the next round waited for the last one's tail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator

from tinyllm.tools.datagen.rounds import Ask
from tinyllm.tools.datagen.teacher import Teacher, job_seed


class _Round:
    def __init__(self, r: int, steps: Generator):
        self.r, self.steps = r, steps
        self.ask: Ask | None = None
        self.rids: list[int | None] = []
        self.left = 0  # requests of the current Ask still running
        self.result = None


def stream_rounds(teacher: Teacher, start: Callable[[int], Generator], first: int, in_flight: int,
                  more: Callable[[], bool]) -> Iterator[tuple[int, object]]:
    engine = teacher.engine()
    running: dict[int, _Round] = {}  # round -> its state
    owner: dict[int, _Round] = {}  # request id -> its round
    done: dict[int, object] = {}  # finished rounds waiting for the ones before them
    next_r, next_out = first, first

    def advance(rnd: _Round, replies: list | None) -> None:
        """Send the round its replies (None: start it); queue its next Ask, or keep its result."""
        while True:
            try:
                rnd.ask = rnd.steps.send(replies)
            except StopIteration as end:
                done[rnd.r] = end.value
                del running[rnd.r]
                return
            ask = rnd.ask
            pre = ask.prefills or [""] * len(ask.jobs)
            rnd.rids = [teacher.submit(m, ask.params, job_seed(ask.seed, i), p)
                        for i, (m, p) in enumerate(zip(ask.jobs, pre, strict=True))]
            rnd.left = sum(rid is not None for rid in rnd.rids)
            for rid in rnd.rids:
                if rid is not None:
                    owner[rid] = rnd
            if rnd.left:
                return
            replies = answers(rnd)  # nothing to run (no jobs, or none fits): straight on

    def answers(rnd: _Round) -> list:
        pre = rnd.ask.prefills or [""] * len(rnd.rids)
        return [teacher.reply(rid, p) for rid, p in zip(rnd.rids, pre, strict=True)]

    t0 = time.perf_counter()
    while True:
        while len(running) < in_flight and more():
            rnd = running[next_r] = _Round(next_r, start(next_r))
            next_r += 1
            advance(rnd, None)
        while next_out in done:
            teacher.add_time(t0)
            yield next_out, done.pop(next_out)
            t0 = time.perf_counter()
            next_out += 1
        if not running:
            break
        for ev in engine.step():
            if ev.finish_reason is not None and ev.request_id in owner:
                rnd = owner.pop(ev.request_id)
                rnd.left -= 1
                if rnd.left == 0:
                    advance(rnd, answers(rnd))
    teacher.add_time(t0)
