"""The decode step's first compile, in a child process: it compiles the step ahead of time and
saves it (tinyllm.decode.saved_step) where `saved_path(spec)` says, for the session to load.

Why a process: the compiler is Python and holds the GIL, and a reply decoding eagerly beside it
takes the GIL back for every op. Measured on the 2-core CPU: SmolLM2's first reply ran at
1.9 tok/s during a cold compile in the session's process (22.5 alone); a compiler in another
process leaves the GIL alone and takes only a lower-priority core.

Contract:
- `Spec`: what the child needs to rebuild the same model and the same step: how the model was
  opened (path, device, quant), the decoder (max_len, threads, n_valid, greedy, backend).
- `warm_up(spec, timeout) -> str`: runs `python -m tinyllm.decode.compile_child SPEC_JSON` at the
  lowest CPU priority and waits. Returns "" when the child compiled, else why not (one line),
  "cached" without starting one when a child already compiled this spec (a marker in
  Inductor's cache folder, so clearing that cache clears the marker too). A failure is never
  raised: the session's own compile runs next either way and reports its own errors.
- The key of the marker: the spec, torch's version, the model files' sizes and times, and
  tinyllm's source (a changed step compiles anew). `saved_path(spec)`: the saved step's file,
  the same key (Inductor's steps only).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Spec:
    path: str
    device: str
    quant: str
    max_len: int
    threads: int | None
    n_valid: int | None
    greedy: bool
    backend: str


def _files_key(path: Path) -> list:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()]


def marker(spec: Spec) -> Path:
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    h = hashlib.sha256(json.dumps([asdict(spec), torch.__version__, _files_key(Path(spec.path))]).encode())
    for src in sorted(Path(__file__).parents[1].rglob("*.py")):
        h.update(src.read_bytes())
    return Path(cache_dir()) / "tinyllm-warm" / h.hexdigest()[:24]


def saved_path(spec: Spec) -> Path | None:
    """Where the step compiled for this spec is saved (tinyllm.decode.saved_step), beside its marker;
    None where it is not saved (a backend other than Inductor, or a torch without the API)."""
    from tinyllm.decode import saved_step

    if spec.backend != "inductor" or not saved_step.supported():
        return None
    return marker(spec).with_suffix(".step")


def warm_up(spec: Spec, timeout: float = 3600) -> str:
    try:
        done = marker(spec)
        if done.exists():
            return "cached"
        r = subprocess.run([sys.executable, "-m", "tinyllm.decode.compile_child", json.dumps(asdict(spec))],
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            lines = (r.stderr or "").strip().splitlines()
            return (lines[-1] if lines else f"exit status {r.returncode}")[:300]
        done.parent.mkdir(parents=True, exist_ok=True)
        done.touch()
        return ""
    except Exception as e:  # a child that cannot run leaves the session's own compile in place
        return f"{type(e).__name__}: {e}"[:300]


def main(argv: list[str]) -> int:
    spec = Spec(**json.loads(argv[0]))
    import torch

    from tinyllm.decode.compile_step import compile_step, lower_priority
    from tinyllm.formats.open_model import open_any

    lower_priority()  # below the decoding process, with the compiler processes it starts

    if spec.threads:
        torch.set_num_threads(spec.threads)
    try:
        model = open_any(spec.path, torch.device(spec.device), quant=spec.quant)[0]
        compile_step(model, 1, spec.max_len, spec.backend, spec.n_valid, spec.greedy, saved_path(spec))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"{type(e).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
