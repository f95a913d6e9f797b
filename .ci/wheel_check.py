"""CI's wheel check: tinyllm-chat installed from its wheel, beyond the clone, opens the default model.

    VENV/bin/python CLONE/.ci/wheel_check.py WHEEL CLONE

.ci/run builds WHEEL from CLONE (with the CPU kernels prebuilt: setup.py), installs it with the
torch pin into a fresh venv VENV (nothing else), and runs this with VENV's python from a folder
outside the clone, stdin closed. It fails (AssertionError, exit code 1) unless, in order:
1. the wheel holds exactly what the clone tracks under tinyllm/ and chat_app/, models/__init__.py,
   and of each models/<name>/ folder what a loader reads (config.json, tokenizer.model, the
   weights and their index) and the model card, byte for byte, as tinyllm_models/<name>/, and
   beyond those the prebuilt CPU kernels (PREBUILT: the library and its manifest, for this
   torch's release and the clone's sources), and its metadata requires that torch release; and
   it is under MAX_WHEEL_MB;
2. this python imports chat_app, tinyllm and tinyllm_models from its own site-packages (never
   the clone), the default model is found there, the `tinyllm-chat` entry point is
   chat_app.__main__:main, and the `tinyllm-chat --help` it installed names that model; the
   seed's names import from the seed's paths (tinyllm.cuda_graph, tinyllm.kv_cache, tinyllm.model)
   and `tinyllm --help`, the library's command, lists its subcommands;
3. the app, built from the command line `tinyllm-chat` gets with no --model, runs headless under
   Textual's Pilot with no compiler (CXX=/nonexistent) and an empty cache folder (XDG_CACHE_HOME
   a new folder, TINYLLM_CACHE_DIR unset): its model process decodes with the native step (the
   prebuilt library: nothing was built, the cache folder holds no kernels after), and a prompt
   typed into it and sent with Enter gets a non-empty reply from the default model within
   REPLY_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

MAX_WHEEL_MB = 90  # about 73 MB, nearly all of it the default model: a second checkpoint or stray data fails
REPLY_TIMEOUT_S = 300  # load and reply take about 20 s on a 2-core CPU; this only stops a hung run
PROMPT = "Hello! What can you help me with?"
DIST_INFO = ".dist-info/"
PREBUILT = ["tinyllm/kernels/_prebuilt/tinyllm_cpu_qgemv.so", "tinyllm/kernels/_prebuilt/tinyllm_cpu_qgemv.json"]


def expected_files(clone: Path) -> dict[str, Path]:
    """Each file the wheel must hold -> its source in the clone."""
    tracked = subprocess.run(["git", "-C", str(clone), "ls-files", "tinyllm", "chat_app"], check=True,
                             capture_output=True, text=True).stdout.split()
    files = {name: clone / name for name in tracked}
    files["tinyllm_models/__init__.py"] = clone / "models" / "__init__.py"
    for folder in sorted(p for p in (clone / "models").iterdir() if (p / "config.json").is_file()):
        index = folder / "model.safetensors.index.json"
        weights = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
        names = ["config.json", "tokenizer.model", "README.md"] + (["model.safetensors.index.json", *weights]
                                                                     if index.is_file() else ["model.safetensors"])
        for name in names:
            files[f"tinyllm_models/{folder.name}/{name}"] = folder / name
    return files


def check_contents(wheel: Path, clone: Path) -> None:
    size_mb = wheel.stat().st_size / 1e6
    assert size_mb < MAX_WHEEL_MB, f"the wheel is {size_mb:.1f} MB, over {MAX_WHEEL_MB} MB"
    expected = expected_files(clone)
    with zipfile.ZipFile(wheel) as z:
        held = {n for n in z.namelist() if DIST_INFO not in n and not n.endswith("/")}
        missing, extra = sorted(set(expected) - held), sorted(held - set(expected))
        missing_prebuilt, extra = [n for n in PREBUILT if n not in extra], [n for n in extra if n not in PREBUILT]
        assert not missing and not extra, f"the wheel lacks {missing} and holds {extra} beyond the clone's files"
        assert not missing_prebuilt, f"the wheel lacks the prebuilt CPU kernels {missing_prebuilt} (setup.py)"
        for name, source in expected.items():
            assert z.read(name) == source.read_bytes(), f"{name} in the wheel differs from {source}"
        manifest = json.loads(z.read(PREBUILT[1]))
        (metadata,) = [n for n in z.namelist() if n.endswith(f"{DIST_INFO}METADATA")]
        requires = [line for line in z.read(metadata).decode().splitlines() if line.startswith("Requires-Dist: torch")]
    import torch

    from tinyllm.kernels import cpu_qgemv, prebuilt  # the installed ones; their sources equal the clone's (above)

    assert manifest["torch_release"] == str(torch.__version__).split("+")[0], (manifest, torch.__version__)
    assert manifest["sources"] == prebuilt.source_digest([*cpu_qgemv.SOURCES, *cpu_qgemv.HEADERS],
                                                         cpu_qgemv.prebuilt_flags()), "prebuilt from other sources"
    assert requires == [f"Requires-Dist: torch=={manifest['torch_release']}"], requires
    print(f"wheel: {wheel.name}, {size_mb:.1f} MB, {len(expected)} files as expected, and the CPU kernels "
          f"prebuilt for torch {manifest['torch_release']} ({manifest['compiler']})")


def check_installed(clone: Path) -> Path:
    """The installed packages and the default model come from this venv, not the clone."""
    import importlib.metadata

    import tinyllm_models

    import chat_app
    import tinyllm
    from chat_app.__main__ import DEFAULT_MODEL

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for where in (chat_app.__file__, tinyllm.__file__, tinyllm_models.__file__, DEFAULT_MODEL):
        path = Path(where).resolve()
        assert path.is_relative_to(site) and not path.is_relative_to(clone), f"{where} is not in {site}"
    assert (DEFAULT_MODEL / "config.json").is_file(), f"no default model at {DEFAULT_MODEL}"
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="tinyllm-chat")
    assert script.value == "chat_app.__main__:main", script.value
    bin_dir = Path(sysconfig.get_paths()["scripts"])
    help_text = subprocess.run([str(bin_dir / "tinyllm-chat"), "--help"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=120, env=dict(os.environ, COLUMNS="1000"))
    assert help_text.returncode == 0, help_text.stderr
    assert f"(default: {DEFAULT_MODEL})" in help_text.stdout, help_text.stdout
    seed = ("from tinyllm.cuda_graph import default_buckets, StaticKVCache, StaticLayerKV, GraphDecoder, "
            "SlotGraphDecoder; from tinyllm.kv_cache import causal_kwargs, padded_causal_mask; "
            "from tinyllm.model import Transformer")
    subprocess.run([sys.executable, "-c", seed], check=True, stdin=subprocess.DEVNULL, timeout=120)
    tools = subprocess.run([str(bin_dir / "tinyllm"), "--help"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=120)
    assert tools.returncode == 0 and "convert" in tools.stdout, (tools.stdout, tools.stderr)
    print(f"installed: {bin_dir / 'tinyllm-chat'}; default model {DEFAULT_MODEL}")
    return DEFAULT_MODEL


async def wait_for(pilot, condition, deadline: float, what: str) -> None:
    while not condition():
        errors = [n.message for n in pilot.app._notifications if n.severity == "error"]
        assert not errors, f"the app said, waiting for {what}: {errors}"
        assert time.monotonic() < deadline, f"no {what} within {REPLY_TIMEOUT_S} s"
        await pilot.pause(0.05)


async def check_reply(default_model: Path) -> None:
    """The app as `tinyllm-chat --device cpu --max-tokens 48` builds it: no --model, the native
    step (no compiler is there: the environment main() set)."""
    from chat_app.__main__ import build_app, build_parser

    args = build_parser().parse_args(["--device", "cpu", "--max-tokens", "48"])
    assert args.model is None
    t0 = time.monotonic()
    deadline = t0 + REPLY_TIMEOUT_S
    app = build_app(args)
    async with app.run_test(headless=True, size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.session is not None, deadline, "loaded model")
        assert app.session.name == "tinychat", app.session.name
        assert app.session.step_kind == "native", f"the step is {app.session.step_kind!r}, not the prebuilt native one"
        print(f"loaded with the native step, no compiler, an empty cache: {time.monotonic() - t0:.1f} s")
        await pilot.press(*PROMPT, "enter")
        await wait_for(pilot, lambda: len(app.session.messages) == 2 and not app.busy, deadline, "reply")
        user, reply = app.session.messages
        assert (user.role, user.content) == ("user", PROMPT), user
        assert reply.role == "assistant" and reply.content.strip() and not reply.stopped, reply
    print(f"reply from {default_model.name} in {time.monotonic() - t0:.1f} s: {reply.content.strip()[:120]!r}")


def main() -> None:
    wheel, clone = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    assert not Path.cwd().resolve().is_relative_to(clone), "run this from a folder outside the clone"
    check_contents(wheel, clone)
    default_model = check_installed(clone)
    with tempfile.TemporaryDirectory(prefix="tinyllm-wheel-") as home:  # never the user's chats or config
        os.environ["TINYLLM_CHAT_DATA_DIR"] = f"{home}/data"
        os.environ["TINYLLM_CHAT_CONFIG_DIR"] = f"{home}/config"
        os.environ.pop("TINYLLM_CACHE_DIR", None)  # a first launch on a machine with no compiler
        os.environ.update(XDG_CACHE_HOME=f"{home}/cache", CXX="/nonexistent")
        asyncio.run(check_reply(default_model))
        built = sorted(p.name for p in Path(f"{home}/cache").rglob("tinyllm_cpu_qgemv*"))
        assert not built, f"the kernels were built, not loaded prebuilt: {built}"
    print("wheel check passed")


if __name__ == "__main__":
    main()
