"""Time to the first frame: start tinyllm-chat in a pseudo-terminal, as a user's shell would,
and time from the process start to the first frame it draws (the footer's "Help" on screen),
and to the model being ready (the status bar's "ready"). Then Ctrl+Q.

    python scripts/startup_time.py [--model PATH] [--runs 3] [--timeout 300] [--code DIR ...]
                                   [--compile MODE] [--empty-cache] [--no-compiler]

Prints one line per run and the median. Uses a throwaway data and config folder, and runs
from it (not from the checkout, which `python -m` would put first on sys.path). `--code DIR`
times the chat_app/tinyllm in DIR instead of the installed ones (a checkout of an earlier
commit: `git archive COMMIT | tar -x -C DIR`); give it twice (`--code A --code B`) to time
two alternately, run by run, so both see the same load on a busy machine. `--compile` is the
app's option (default off, as the numbers before issue 46 were taken; on is the app's own
default, the native step on a CPU). A first launch: `--empty-cache` gives each run an empty
cache folder (XDG_CACHE_HOME a new temporary folder, TINYLLM_CACHE_DIR unset), `--no-compiler`
sets CXX=/nonexistent (the kernels then come prebuilt from a wheel, or not at all).
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time

ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1b\][^\x07]*\x07")


def one_run(model: str | None, timeout: float, code: str | None = None, compile: str = "off",
            empty_cache: bool = False, no_compiler: bool = False) -> tuple[float, float | None]:
    """(seconds to the first frame, seconds to "ready" or None)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TINYLLM_CHAT_DATA_DIR=f"{tmp}/data", TINYLLM_CHAT_CONFIG_DIR=f"{tmp}/config",
                   TERM="xterm-256color", COLUMNS="100", LINES="30")
        if code:
            env["PYTHONPATH"] = os.path.abspath(code)
        if empty_cache:
            env.pop("TINYLLM_CACHE_DIR", None)
            env["XDG_CACHE_HOME"] = f"{tmp}/cache"
        if no_compiler:
            env["CXX"] = "/nonexistent"
        master, slave = pty.openpty()
        os.set_blocking(master, False)
        argv = [sys.executable, "-m", "chat_app", "--device", "cpu", "--compile", compile]
        argv += ["--model", model] if model else []
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, cwd=tmp)
        os.close(slave)
        seen, first, ready = b"", None, None
        try:
            while ready is None and time.perf_counter() - start < timeout:
                r, _, _ = select.select([master], [], [], 0.01)
                if not r:
                    if proc.poll() is not None:
                        break
                    continue
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                seen = (seen + chunk)[-200_000:]
                text = ANSI.sub(b"", seen)
                if first is None and b"Help" in text:
                    first = time.perf_counter() - start
                if first is not None and b"ready" in text:
                    ready = time.perf_counter() - start
        finally:
            if proc.poll() is None:
                os.write(master, b"\x11")  # Ctrl+Q
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            os.close(master)
        if first is None:
            raise SystemExit(f"no frame within {timeout} s; last output: {ANSI.sub(b'', seen)[-300:]!r}")
        return first, ready


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--code", action="append", default=None, help="a folder holding chat_app and tinyllm")
    p.add_argument("--compile", default="off",
                   help="the app's --compile (default off; on: the app's default, the native step on a CPU)")
    p.add_argument("--empty-cache", action="store_true", help="each run with an empty cache folder (a first launch)")
    p.add_argument("--no-compiler", action="store_true", help="CXX=/nonexistent")
    args = p.parse_args()
    codes = args.code or [None]
    firsts: dict[str | None, list[float]] = {c: [] for c in codes}
    readies: dict[str | None, list[float | None]] = {c: [] for c in codes}
    for i in range(args.runs):
        for code in codes:
            first, ready = one_run(args.model, args.timeout, code, args.compile, args.empty_cache, args.no_compiler)
            firsts[code].append(first)
            readies[code].append(ready)
            print(f"run {i + 1}{f' {code}' if code else ''}: first frame {first:.2f} s, model ready "
                  f"{'-' if ready is None else f'{ready:.2f} s'}", flush=True)
    for code, times in firsts.items():
        ready = [r for r in readies[code] if r is not None]
        print(f"{code or 'installed'}: time to the first frame: median {statistics.median(times):.2f} s, "
              f"best {min(times):.2f} s over {args.runs} runs; to ready: "
              f"{f'median {statistics.median(ready):.2f} s' if ready else '-'}")


if __name__ == "__main__":
    main()
