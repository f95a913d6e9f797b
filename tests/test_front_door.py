"""`import tinyllm`: the public names, a cheap import, the README's library example, and the
`tinyllm` commands' --help through the installed entry points."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tinyllm
from tinyllm.tools.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's scripts: what `pip install` put on the PATH


def test_import_tinyllm_imports_no_torch():
    code = "import sys, tinyllm; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_name_is_its_home_modules_object():
    import importlib

    assert tinyllm.__all__ == sorted(tinyllm._PUBLIC)
    for name in tinyllm.__all__:
        module, attr = tinyllm._PUBLIC[name]
        assert getattr(tinyllm, name) is getattr(importlib.import_module(module), attr), name
    assert tinyllm.open_model is tinyllm.open_any
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tinyllm.nope  # noqa: B018


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it as a library", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.parametrize("which", [0, 1], ids=["session", "decoder"])
def test_each_readme_library_example_runs_and_replies(which):
    examples = readme_examples()
    assert len(examples) == 2 and len(examples[0].strip().splitlines()) == 5, examples
    proc = subprocess.run([sys.executable, "-c", examples[which]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.split()) >= 3, proc.stdout


def help_of(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_each_documented_command_answers_help_through_its_entry_point():
    runs = [[str(BIN / "tinyllm"), "--help"], [str(BIN / "tinyllm-bench"), "--help"],
            [str(BIN / "tinyllm-chat"), "--help"]] + [[str(BIN / "tinyllm"), c, "--help"] for c in COMMANDS]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(help_of, runs))
    for argv, proc in zip(runs, results, strict=True):
        assert proc.returncode == 0, (argv, proc.stderr[-1000:])
        assert proc.stdout.startswith("usage: "), (argv, proc.stdout[:200])
    for c, proc in zip(COMMANDS, results[3:], strict=True):
        prog = "tinyllm-bench" if c == "bench" else f"tinyllm {c}"
        assert proc.stdout.startswith(f"usage: {prog} "), proc.stdout[:200]
    assert all(c in results[0].stdout for c in COMMANDS)


def test_an_unknown_command_is_one_line_and_exit_2():
    proc = help_of([str(BIN / "tinyllm"), "nope"])
    assert proc.returncode == 2
    assert "invalid choice: 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_readme_and_docs_name_no_tool_module():
    old = re.compile(r"python3? -m tinyllm\.(formats|tools)\.(?!cli\b)")
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").glob("*"),
                 *(ROOT / "models").glob("*/README.md")]:
        if path.is_file() and path.name != "BENCHMARKS-LOG.md":
            assert not old.search(path.read_text()), path
