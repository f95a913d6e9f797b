"""tinyllm.kernels.kernel_build: one build per source, torch version and flags, whatever folder the
source is installed in; a finished build is loaded without compiling; two processes building
at once compile once; the build reports its progress. One real build at most: the session's
(tinyllm.kernels.cpu_qgemv.available()); the rest compile with a stand-in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tinyllm.kernels import cpu_qgemv, kernel_build
from tinyllm.kernels.kernel_build import BuildStatus, ensure_built

FLAGS = (cpu_qgemv.CFLAGS, cpu_qgemv.LDFLAGS)


def install(folder: Path) -> tuple[list[Path], list[Path]]:
    """A copy of the package's C++ files, as another install (a wheel's venv, a clone) has them."""
    folder.mkdir(parents=True)
    for p in (*cpu_qgemv.SOURCES, *cpu_qgemv.HEADERS):
        shutil.copy2(p, folder / p.name)
    return [folder / p.name for p in cpu_qgemv.SOURCES], [folder / p.name for p in cpu_qgemv.HEADERS]


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
def test_two_installs_of_one_source_share_the_build_and_compile_nothing(tmp_path):
    """available() built the package's own files (or found them built) in the session's cache;
    two other installs of the same files, anywhere, find that build, and leave it as it is."""
    library = kernel_build.finished(cpu_qgemv.build_folder())
    assert library is not None and library.parent == cpu_qgemv.build_folder()
    before = library.stat()
    for name in ("wheel-venv", "clone"):
        sources, headers = install(tmp_path / name / "tinyllm")
        assert kernel_build.build_folder(cpu_qgemv.NAME, sources, headers, FLAGS, cpu_qgemv.cache_dir()) \
            == cpu_qgemv.build_folder()
        seen: list[BuildStatus] = []
        build = ensure_built(cpu_qgemv.NAME, sources, headers, FLAGS, cpu_qgemv.cache_dir(), seen.append)
        assert build == kernel_build.Build(library, cached=True) and seen == [BuildStatus("cached")]
    after = library.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # What ninja was given: the cache folder's own copies, not any install's files.
    ninja = (cpu_qgemv.build_folder() / "build.ninja").read_text()
    assert str(cpu_qgemv.build_folder() / "src" / "cpu_step.cpp") in ninja and str(cpu_qgemv.SOURCE.parent) not in ninja


class StandIn:
    """A compile that writes one object file per source, each once the build's report has seen
    the one before (so every count is reported), and then a library; or waits at `gate` first."""

    def __init__(self, seen: list[BuildStatus] | None = None, gate: threading.Event | None = None) -> None:
        self.seen, self.gate, self.calls = seen, gate, 0
        self.entered = threading.Event()

    def __call__(self, name: str, sources: list[Path], flags, folder: Path) -> Path:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(300), "the test never opened the gate"
        assert all(p.parent == folder / "src" and p.is_file() for p in sources)  # built from the copies
        for i, p in enumerate(sources, 1):
            (folder / f"{p.stem}.o").write_bytes(b"")
            while self.seen is not None and not any(s.done >= i for s in self.seen):
                time.sleep(0.01)  # until the reporting thread has seen it (state, not time, ends it)
        library = folder / f"{name}.so"
        library.write_bytes(b"a library")
        return library


def test_a_build_reports_each_file_compiled_then_built_then_cached(tmp_path, monkeypatch):
    seen: list[BuildStatus] = []
    monkeypatch.setattr(kernel_build, "_compile", StandIn(seen))
    sources, headers = install(tmp_path / "install")
    build = ensure_built("k", sources, headers, FLAGS, tmp_path / "cache", seen.append)
    n = len(sources)
    assert not build.cached and build.library.read_bytes() == b"a library"
    assert seen[0] == BuildStatus("building", 0, n, 0.0) and seen[-1].state == "built"
    assert {s.done for s in seen if s.state == "building"} == set(range(n + 1))  # every count, in order
    assert [s.done for s in seen] == sorted(s.done for s in seen)
    assert (build.library.parent / "built").read_text() == build.library.name
    again: list[BuildStatus] = []
    assert ensure_built("k", sources, headers, FLAGS, tmp_path / "cache", again.append) == \
        kernel_build.Build(build.library, cached=True)
    assert again == [BuildStatus("cached")]


def test_a_failed_build_says_so_and_leaves_no_finished_build(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("c++: internal compiler error")

    monkeypatch.setattr(kernel_build, "_compile", broken)
    sources, headers = install(tmp_path / "install")
    seen: list[BuildStatus] = []
    with pytest.raises(RuntimeError, match="internal compiler error"):
        ensure_built("k", sources, headers, FLAGS, tmp_path / "cache", seen.append)
    assert [s.state for s in seen] == ["building", "failed"]
    assert kernel_build.finished(kernel_build.build_folder("k", sources, headers, FLAGS, tmp_path / "cache")) is None


def test_two_builds_at_once_compile_once_and_both_get_the_library(tmp_path, monkeypatch):
    """The second waits on the folder's lock while the first compiles, then finds its build.
    (flock: two opens of the lock file exclude each other, threads of one process too.)"""
    gate = threading.Event()
    compile = StandIn(gate=gate)
    monkeypatch.setattr(kernel_build, "_compile", compile)
    a, b = install(tmp_path / "a"), install(tmp_path / "b")  # two installs of one source
    results: dict[str, kernel_build.Build] = {}
    second_started = threading.Event()

    def build(key: str, files, said=None) -> None:
        results[key] = ensure_built("k", *files, FLAGS, tmp_path / "cache", said)

    first = threading.Thread(target=build, args=("first", a))
    first.start()
    assert compile.entered.wait(300)  # the first holds the lock, compiling
    second = threading.Thread(target=build, args=("second", b, lambda s: second_started.set()))
    second.start()
    assert second_started.wait(300)  # it reported "building": it is at the lock (or past it)
    gate.set()
    first.join(300)
    second.join(300)
    assert compile.calls == 1
    assert not results["first"].cached and results["second"] == kernel_build.Build(results["first"].library, True)


def test_the_key_is_the_content_not_the_place(tmp_path):
    a, b = install(tmp_path / "a"), install(tmp_path / "b")
    root = tmp_path / "cache"
    assert kernel_build.build_folder("k", *a, FLAGS, root) == kernel_build.build_folder("k", *b, FLAGS, root)
    assert kernel_build.build_folder("k", *a, (FLAGS[0] + ["-DX"], FLAGS[1]), root) != \
        kernel_build.build_folder("k", *a, FLAGS, root)
    os.utime(a[0][0], (0, 0))  # a file's time is no part of it
    assert kernel_build.build_folder("k", *a, FLAGS, root) == kernel_build.build_folder("k", *b, FLAGS, root)


def test_a_build_leaves_the_callers_flags_and_so_its_key_as_they_were(tmp_path, monkeypatch):
    """cpp_extension.load appends torch's libraries to the extra_ldflags it is given, in place;
    given the caller's own lists, the build's key changed under it, so the next ensure_built in
    the same process built again in another folder, and loading that second copy of the library
    aborted the process (a fresh cache, as CI has). A stand-in load that mutates its arguments as
    torch's does: the caller's flags, and so the build folder, stay what they were."""
    from torch.utils import cpp_extension

    def load(name, sources, extra_cflags, extra_ldflags, build_directory, **kwargs):
        extra_cflags.append("-DADDED_BY_LOAD")
        extra_ldflags += ["-ltorch", "-lc10"]  # what torch's load does for is_python_module=False
        library = Path(build_directory) / f"{name}.so"
        library.write_bytes(b"a library")
        return str(library)

    monkeypatch.setattr(cpp_extension, "load", load)
    sources, headers = install(tmp_path / "install")
    flags = (["-O2"], ["-fopenmp"])
    folder = kernel_build.build_folder("k", sources, headers, flags, tmp_path / "cache")
    first = ensure_built("k", sources, headers, flags, tmp_path / "cache")
    assert flags == (["-O2"], ["-fopenmp"]) and not first.cached
    assert kernel_build.build_folder("k", sources, headers, flags, tmp_path / "cache") == folder
    assert ensure_built("k", sources, headers, flags, tmp_path / "cache") == kernel_build.Build(first.library, True)


@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="no /proc: the files compiling are not shown")
def test_the_watch_names_the_files_a_process_compiles_now(tmp_path):
    """While the count of object files stands still (the two files with torch's headers take most
    of a build), the report names the sources whose compiler runs: any process whose command line
    names a copy in the folder's src/."""
    folder = tmp_path / "k-0123"
    (folder / "src").mkdir(parents=True)
    watch = kernel_build._Watch(folder, ["cpu_step", "cpu_qgemv", "cpu_tiles"], 0.0, lambda status: None)
    assert watch.compiling() == ()
    fake = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-c", str(folder / "src" / name),
                              "-o", name.replace(".cpp", ".o")]) for name in ("cpu_tiles.cpp", "cpu_step.cpp")]
    try:
        deadline = time.monotonic() + 10
        while watch.compiling() != ("cpu_step.cpp", "cpu_tiles.cpp") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.compiling() == ("cpu_step.cpp", "cpu_tiles.cpp")  # in the sources' order
    finally:
        for p in fake:
            p.kill()
            p.wait()
    assert watch.compiling() == ()
