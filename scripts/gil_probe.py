"""How long the background compile keeps other threads from the GIL (docs/BENCHMARKS-LOG.md, issue 10).

Opens a ChatSession with the compiled step (warm if the caches are), and while its background
compile runs, a probe thread sleeps 1 ms at a time and records every wake-up late by more than
20 ms, with where the compile thread stood right after. Run from the repository root:
    python scripts/gil_probe.py MODEL [cpu|cuda]
"""

import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyllm.session.chat import open_session  # noqa: E402

LATE_S = 0.02


def compile_thread_stack() -> str:
    frames = sys._current_frames()
    for t in threading.enumerate():
        if t.name == "tinyllm-compile" and t.ident in frames:
            stack = traceback.extract_stack(frames[t.ident])[-4:][::-1]
            return " <- ".join(f"{f.name}({f.filename.split('site-packages/')[-1]}:{f.lineno})" for f in stack)
    return ""


def main() -> None:
    path, device = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cpu")
    t0 = time.perf_counter()
    session = open_session(path, device, max_len=512, compile="inductor")
    late: list[tuple[float, float, str]] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            a = time.perf_counter()
            time.sleep(0.001)
            waited = time.perf_counter() - a - 0.001
            if waited > LATE_S:
                late.append((a - t0, waited, compile_thread_stack()))

    threading.Thread(target=probe, daemon=True).start()
    session.wait_compiled(timeout=900)
    done.set()
    marks = session.timeline
    print(f"compile {marks.get('compiled', 0) - marks['model_loaded']:.1f} s after the load, step {session.step_kind}")
    print(f"late wake-ups over {LATE_S * 1000:.0f} ms: {len(late)}, {sum(w for _, w, _ in late):.2f} s in all")
    for at, waited, where in sorted(late, key=lambda x: -x[1])[:15]:
        print(f"{at:7.2f}s +{waited * 1000:5.0f} ms  {where[:300]}")


if __name__ == "__main__":
    main()
