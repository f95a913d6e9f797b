"""Time to the first token without a window: `tinyllm-chat -p PROMPT` against the library alone
(`tinyllm.open_session` then `send`, in a fresh process), both timed the same way, in one run.

    python scripts/oneshot_startup.py [--model PATH] [--runs 5] [--prompt TEXT]

Each run starts a fresh process and times, from its start, the first byte of the reply on its
stdout (the library's script prints each token as it comes, as `-p` does) and the process's
end (each stops after 8 tokens), and the CPU seconds it (with its children) had used by that
first byte, read from /proc: on a machine other jobs keep busy the wall clock of one start
varies by seconds, its CPU time by little. They alternate run by run, so all see the same load.
Prints one line per run, then the medians, and the median of each run's difference from the
library (issue 52: -p may take at most 0.3 s more). Uses a throwaway data and config
folder; `-p` runs with --no-save and once more saving (the default: chat.db's writes timed too).
The fourth, "model process", is the library's session in the app's child process
(chat_app.remote_session): -p as it would be if it did not load the model itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIBRARY = """
import sys
import tinyllm
session = tinyllm.open_session(sys.argv[1])
for event in session.send(sys.argv[2]):
    if isinstance(event, tinyllm.Token) and event.text:
        sys.stdout.write(event.text)
        sys.stdout.flush()
    if isinstance(event, tinyllm.Token) and event.stats.tokens >= 8:
        session.stop()
"""

PROCESS = """
import sys
from chat_app.remote_session import RemoteSession
from tinyllm.session.chat_events import Token
session = RemoteSession(dict(path=sys.argv[1]))
for event in session.send(sys.argv[2]):
    if isinstance(event, Token) and event.text:
        sys.stdout.write(event.text)
        sys.stdout.flush()
    if isinstance(event, Token) and event.stats.tokens >= 8:
        session.stop()
session.close()
"""


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children so far, from /proc (Linux)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, float]:
    """(seconds to the first byte on stdout, seconds to the process's end, CPU seconds to the
    first byte: the process's and its children's, which a busy machine changes less than the wall
    clock)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    at = time.perf_counter() - start
    cpu = cpu_seconds(proc.pid)
    proc.stdout.read()
    proc.wait()
    if not first or proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} wrote nothing or failed (exit {proc.returncode})")
    return at, time.perf_counter() - start, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repo = Path(__file__).resolve().parent.parent
    p.add_argument("--model", default=str(repo / "models" / "tinychat"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--prompt", default="Name three colours.")
    a = p.parse_args()
    cli = str(Path(sys.executable).with_name("tinyllm-chat"))
    rows: dict[str, list[tuple[float, float, float]]] = {"library": [], "-p --no-save": [], "-p (saved)": [],
                                                         "model process": []}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TINYLLM_CHAT_DATA_DIR=f"{tmp}/data", TINYLLM_CHAT_CONFIG_DIR=f"{tmp}/config")
        argvs = {"library": [sys.executable, "-c", LIBRARY, a.model, a.prompt],
                 "-p --no-save": [cli, "--model", a.model, "-p", a.prompt, "--max-tokens", "8", "--no-save"],
                 "-p (saved)": [cli, "--model", a.model, "-p", a.prompt, "--max-tokens", "8"],
                 "model process": [sys.executable, "-c", PROCESS, a.model, a.prompt]}
        timed(argvs["library"], env, tmp)  # a first run warms the page cache and builds nothing later ones time
        for run in range(a.runs):
            for name, argv in argvs.items():
                rows[name].append(timed(argv, env, tmp))
                first, end, cpu = rows[name][-1]
                print(f"run {run + 1}  {name:14} first token {first:.2f} s (CPU {cpu:.2f} s)   exit {end:.2f} s",
                      flush=True)
    for name, r in rows.items():
        first, end, cpu = (statistics.median(x[i] for x in r) for i in range(3))
        print(f"median  {name:14} first token {first:.2f} s (CPU {cpu:.2f} s)   exit {end:.2f} s")
    lib = rows["library"]
    for name in ("-p --no-save", "-p (saved)", "model process"):
        first, end, cpu = (statistics.median(r[i] - b[i] for r, b in zip(rows[name], lib, strict=True))
                           for i in range(3))
        print(f"{name} minus the library, the median of each run's difference: first token {first:+.2f} s "
              f"(CPU {cpu:+.2f} s), exit {end:+.2f} s")


if __name__ == "__main__":
    main()
