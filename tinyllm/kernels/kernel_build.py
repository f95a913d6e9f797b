"""One build of a C++ extension per source, torch version and flags, shared by every install
of that source: the build cache tinyllm.kernels.cpu_qgemv builds the CPU kernels into.

Why a folder of its own per key: torch.utils.cpp_extension writes the sources' absolute paths
(and torch's) into build.ninja, so two installs of one source (a clone, a wheel in a venv)
building into one folder rebuilt each other's build each time the other one ran. Here the
folder's name is the key, the sources are copied into it before the build (every install then
writes the same build.ninja), and a finished build is loaded without running ninja at all.

Contract:
- `build_key(files, flags) -> str`: 16 hex digits of a hash of the files' names and contents,
  the flags, torch's version, the Python ABI (cache tag), the machine and the compiler's name
  ($CXX). Not of where the files are.
- `ensure_built(name, sources, headers, flags, root, report=None) -> Build`: the library of
  `sources` (headers: what they include by name, beside them), built under
  `root/NAME-KEY/` (flags: cflags, ldflags). A folder whose `built` file names its library
  answers at once: Build(library, cached=True), nothing compiled, nothing locked. Otherwise
  the caller takes the folder's OS lock (released by the OS when its holder dies: kill -9 or
  Ctrl+C mid-build leave nothing that blocks), copies the sources into `src/`, compiles them
  (cpp_extension, ninja: a killed build goes on from the files it finished) and writes
  `built` last, atomically: Build(library, cached=False). A process that waited on the lock
  while another built finds `built` and loads that build (cached=True). Two processes never
  write into one folder at once, and a reader only reads a folder that is finished.
  The library may already be loaded into the process that built it (cpp_extension loads it).
- `report(BuildStatus)`: "cached" once; or "building" at the start, then each time another
  source's object file appears and at least every REPORT_S (done/total: sources compiled of
  all, seconds since the start, and on Linux the sources a compiler is working on now, from
  the processes' command lines: the two files with torch's headers take most of a build, so
  the count alone stands still for seconds; from a thread of its own), then "built" or
  "failed" once (the exception then propagates).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # Windows: no AVX2 build is tried there anyway (no c++ on PATH as a rule)
    fcntl = None  # type: ignore[assignment]

REPORT_S = 1.0  # a build in progress is reported at least this often (its seconds go on)
POLL_S = 0.2  # how often the build folder is looked at for new object files
DONE = "built"  # the file that names the finished library; written last


@dataclass(frozen=True)
class BuildStatus:
    state: str  # "cached" | "building" | "built" | "failed"
    done: int = 0  # sources compiled so far (their object files exist)
    total: int = 0  # sources in all
    seconds: float = 0.0  # since the build began ("building", "built", "failed")
    compiling: tuple[str, ...] = ()  # "building": the sources being compiled now, where it can tell (Linux)


@dataclass(frozen=True)
class Build:
    library: Path  # the shared library to load
    cached: bool  # found finished: nothing was compiled


Report = Callable[[BuildStatus], None]


def build_key(files: Sequence[Path], flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in (*flags, torch.__version__, sys.implementation.cache_tag, platform.machine(),
                 os.environ.get("CXX", "c++")):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def build_folder(name: str, sources: Sequence[Path], headers: Sequence[Path], flags: tuple[list[str], list[str]],
                 root: Path) -> Path:
    cflags, ldflags = flags
    return root / f"{name}-{build_key([*sources, *headers], [*cflags, '|', *ldflags])}"


def finished(folder: Path) -> Path | None:
    """The library of a finished build in `folder`, or None."""
    try:
        library = folder / (folder / DONE).read_text().strip()
    except OSError:
        return None
    return library if library.name and library.is_file() else None


def ensure_built(name: str, sources: Sequence[Path], headers: Sequence[Path], flags: tuple[list[str], list[str]],
                 root: Path, report: Report | None = None) -> Build:
    say = report or (lambda status: None)
    folder = build_folder(name, sources, headers, flags, root)
    if (library := finished(folder)) is not None:
        say(BuildStatus("cached"))
        return Build(library, True)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    watch = _Watch(folder, [p.stem for p in sources], started, say)
    try:
        with watch, _lock(folder):  # counts the objects of a build another process runs, too
            if (library := finished(folder)) is not None:  # built by another process meanwhile
                watch.stop()
                say(BuildStatus("cached"))
                return Build(library, True)
            library = _compile(name, _copy_sources(folder / "src", [*sources, *headers])[:len(sources)],
                               flags, folder)
            _write_atomically(folder / DONE, library.relative_to(folder).as_posix())
    except BaseException:
        say(BuildStatus("failed", watch.done(), len(sources), time.monotonic() - started))
        raise
    say(BuildStatus("built", len(sources), len(sources), time.monotonic() - started))
    return Build(library, False)


def _compile(name: str, sources: list[Path], flags: tuple[list[str], list[str]], folder: Path) -> Path:
    """Compile and link `sources` in `folder` (cpp_extension, which also loads the library)."""
    from torch.utils import cpp_extension

    cflags, ldflags = flags
    # Copies: load() appends torch's own libraries to extra_ldflags in place, which would change
    # the caller's flags and so the build's key (the next call would build again, elsewhere).
    library = cpp_extension.load(name, [str(p) for p in sources], extra_cflags=list(cflags),
                                 extra_ldflags=list(ldflags), build_directory=str(folder),
                                 is_python_module=False, verbose=False)
    return Path(str(library))


def _copy_sources(src: Path, files: list[Path]) -> list[Path]:
    """The files copied into `src` (each written whole, and only where it differs: ninja keeps
    what it compiled from a copy that did not change)."""
    src.mkdir(exist_ok=True)
    copies = []
    for p in files:
        copy, data = src / p.name, p.read_bytes()
        if not copy.is_file() or copy.read_bytes() != data:
            _write_atomically(copy, data)
        copies.append(copy)
    return copies


def _write_atomically(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


@contextmanager
def _lock(folder: Path):
    """Hold the build folder against other processes, with a lock the OS releases when its
    holder dies (kill -9, Ctrl+C mid-build). cpp_extension's own `lock` file is a plain file it
    waits on forever: one left by a killed build is stale once we hold this, so it goes."""
    with open(folder / "tinyllm-build.lock", "a") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)  # waits while another process builds
        (folder / "lock").unlink(missing_ok=True)
        yield


class _Watch:
    """A thread that reports a build's progress: the sources whose object file exists in the
    folder (ninja compiles them in parallel; the link comes after the last)."""

    def __init__(self, folder: Path, stems: list[str], started: float, say: Report) -> None:
        self.folder, self.stems, self.started, self.say = folder, stems, started, say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tinyllm-build-watch", daemon=True)

    def done(self) -> int:
        return sum((self.folder / f"{stem}.o").is_file() for stem in self.stems)

    def __enter__(self) -> _Watch:
        self.say(BuildStatus("building", self.done(), len(self.stems), 0.0))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def compiling(self) -> tuple[str, ...]:
        """The sources (their file names) a process's command line names in this folder's src/
        now: the compilers ninja runs. Empty where /proc cannot say."""
        src = f"{self.folder / 'src'}/".encode()
        names: set[str] = set()
        try:
            procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
        except OSError:
            return ()
        for proc in procs:
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if src in cmdline:
                args = cmdline.split(b"\0")
                names.update(a[len(src):].decode() for a in args if a.startswith(src) and a.endswith(b".cpp"))
        return tuple(n for n in (f"{stem}.cpp" for stem in self.stems) if n in names)

    def _run(self) -> None:
        last_done, last_at = self.done(), time.monotonic()
        while not self._stop.wait(POLL_S):
            done, now = self.done(), time.monotonic()
            if done != last_done or now - last_at >= REPORT_S:
                self.say(BuildStatus("building", done, len(self.stems), now - self.started, self.compiling()))
                last_done, last_at = done, now
