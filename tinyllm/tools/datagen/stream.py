"""Rounds side by side through one engine: the teacher's engine never drains between stages.

Contract:
- `stream_rounds(teacher, start(r), first, in_flight, more()) -> iterator of (r, result)`:
  rounds first, first + 1, ... each a generator made by `start(r)` (rounds.round_steps: it
  yields the `Ask`s it waits on, is sent their replies, returns its result). Up to
  `in_flight` rounds run at once. Each round's current Ask feeds the teacher's one engine
  (`Teacher.submit`, job i seeded `job_seed(ask.seed, i)`, as `Teacher.chat` seeds it), the
  oldest round's jobs first, and only as far as the engine has slots to fill: at most
  n_slots requests wait at a time, so prompts are encoded a few at a time between steps
  while the device runs the chain in flight, not thousands at once while it idles. The
  moment an Ask's last request ends, its round is sent the replies and its next Ask's jobs
  queue up while the other rounds' requests run on. A new round starts (when `more()` says
  so) as soon as fewer than `in_flight` run. Results come out in round order.
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
from collections import deque
from collections.abc import Callable, Generator, Iterator

from tinyllm.tools.datagen.rounds import Ask
from tinyllm.tools.datagen.teacher import Teacher, job_seed


class _Round:
    def __init__(self, r: int, steps: Generator):
        self.r, self.steps = r, steps
        self.ask: Ask | None = None
        self.rids: list[int | None] = []
        self.todo: deque[int] = deque()  # jobs of the current Ask not yet in the engine
        self.left = 0  # jobs of the current Ask not yet ended


def stream_rounds(teacher: Teacher, start: Callable[[int], Generator], first: int, in_flight: int,
                  more: Callable[[], bool]) -> Iterator[tuple[int, object]]:
    engine = teacher.engine()
    running: dict[int, _Round] = {}  # round -> its state, oldest first
    owner: dict[int, _Round] = {}  # request id -> its round
    done: dict[int, object] = {}  # finished rounds waiting for the ones before them
    next_r, next_out = first, first

    def prefill(rnd: _Round, i: int) -> str:
        return rnd.ask.prefills[i] if rnd.ask.prefills else ""

    def advance(rnd: _Round, replies: list | None) -> None:
        """Send the round its replies (None: start it): its next Ask's jobs queue up, or it ends."""
        try:
            rnd.ask = rnd.steps.send(replies)
        except StopIteration as end:
            done[rnd.r] = end.value
            del running[rnd.r]
            return
        n = len(rnd.ask.jobs)
        rnd.rids, rnd.todo, rnd.left = [None] * n, deque(range(n)), n
        if not n:
            advance(rnd, [])

    def ended(rnd: _Round) -> None:
        """One job of the round's Ask has ended (or could not start)."""
        rnd.left -= 1
        if rnd.left == 0:
            advance(rnd, [teacher.reply(rid, prefill(rnd, i)) for i, rid in enumerate(rnd.rids)])

    def feed() -> None:
        """Queue the oldest rounds' jobs while fewer than n_slots requests wait."""
        for rnd in list(running.values()):
            while rnd.todo and engine.waiting < engine.n_slots:
                i = rnd.todo.popleft()
                ask = rnd.ask
                rid = rnd.rids[i] = teacher.submit(ask.jobs[i], ask.params, job_seed(ask.seed, i), prefill(rnd, i))
                if rid is None:
                    ended(rnd)  # its prompt leaves no room: an empty reply (the round may move on)
                else:
                    owner[rid] = rnd

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
        feed()
        for ev in engine.step():
            if ev.finish_reason is not None and ev.request_id in owner:
                ended(owner.pop(ev.request_id))
    teacher.add_time(t0)
