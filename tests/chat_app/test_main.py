"""The command line: bad input is one line on stderr and exit code 2, --help stays light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partialmethod
from pathlib import Path

import pytest

import chat_app.__main__ as cli


def run_main(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tinyllm-chat: error: "), err
    assert "Traceback" not in err
    return err


def test_missing_model_path(capsys, tmp_path):
    assert "does not exist" in run_main(capsys, "--model", str(tmp_path / "nope"))


def test_folder_without_checkpoint(capsys, tmp_path):
    assert "config.json" in run_main(capsys, "--model", str(tmp_path))


def test_truncated_safetensors(capsys, ckpt, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ckpt.iterdir():
        data = f.read_bytes()
        (broken / f.name).write_bytes(data[: len(data) // 2] if f.name == "model.safetensors" else data)
    assert "truncated" in run_main(capsys, "--model", str(broken))


@pytest.mark.parametrize("fault, message", [("tokenizer", "sentencepiece"), ("config", "does not match")])
def test_faults_only_the_loader_finds_end_the_app_in_one_line(capsys, ckpt, tmp_path, monkeypatch, fault, message):
    """The TUI is open by then (the session's child found it: it needs torch); the app ends and
    main() says it the same way, exit code 2."""
    from chat_app.app import ChatApp

    monkeypatch.setattr(ChatApp, "run", partialmethod(ChatApp.run, headless=True))
    monkeypatch.setattr(cli, "need_terminal", lambda: None)  # headless: no terminal needed
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ckpt.iterdir():
        data = f.read_bytes()
        if f.name == "tokenizer.model" and fault == "tokenizer":
            data = b"junk"
        if f.name == "config.json" and fault == "config":
            config = json.loads(data)
            config["model"]["n_layers"] += 1
            data = json.dumps(config).encode()
        (broken / f.name).write_bytes(data)
    assert message in run_main(capsys, "--model", str(broken), "--compile", "off")


def test_default_model_found(monkeypatch):
    """From the package tinyllm_models (the editable install maps it to models/; a wheel carries
    it) and, where that is not installed, beside the source tree: models/tinychat either way."""
    shipped = Path(__file__).resolve().parents[2] / "models" / "tinychat"
    assert cli.find_default_model() == shipped == cli.DEFAULT_MODEL
    monkeypatch.setitem(sys.modules, "tinyllm_models", None)  # importing it fails, as in a clone run uninstalled
    assert cli.find_default_model() == shipped


def test_default_model_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "models" / "tinychat")
    assert "--model" in run_main(capsys)


@pytest.mark.parametrize("argv", [["--temperature", "-1"], ["--top-p", "0"], ["--max-tokens", "0"],
                                  ["--max-len", "abc"], ["--template", "nope"], ["--device", "tpu"],
                                  ["--temperature", "nan"], ["--top-p", "inf"], ["--seed", "99999999999999999999999"]])
def test_bad_settings(capsys, ckpt, argv):
    run_main(capsys, "--model", str(ckpt), *argv)


def test_help_and_the_ui_import_no_torch():
    code = ("import sys\nimport chat_app.app\nassert 'torch' not in sys.modules, 'the UI imports torch'\n"
            "import chat_app.__main__ as m\ntry:\n    m.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "--resume" in out.stdout
    code = ("import sys, chat_app.__main__ as m\ntry:\n    m.main(['--help'])\nexcept SystemExit:\n"
            "    pass\nassert 'textual' not in sys.modules and 'torch' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_nothing_before_the_first_frame_imports_torch(ckpt, tmp_path):
    """build_app makes every check it makes before the TUI opens without torch (the session's
    child imports it): the first frame does not wait seconds for it."""
    code = ("import sys\nfrom chat_app.__main__ import build_app, build_parser\n"
            f"app = build_app(build_parser().parse_args(['--model', {str(ckpt)!r}, '--temperature', '0.5']))\n"
            "assert 'torch' not in sys.modules, 'build_app imported torch'\nprint(app.model_name)\n")
    env = {**os.environ, "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "data"),
           "TINYLLM_CHAT_CONFIG_DIR": str(tmp_path / "config")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tiny-test"


@pytest.mark.parametrize("argv, says", [
    (["--temperature", "1e308"], "temperature must be 0 (greedy) or from 0.001 to 100, got 1e+308"),
    (["--top-k", str(10**30)], f"top_k must be from 0 (off) to 1,000,000, got {10**30}"),
    (["--repeat-penalty", "1e-40"], "repeat_penalty must be from 0.01 to 100 (1 = off), got 1e-40"),
    (["--top-p", "1e-300"], "top_p must be from 0.001 to 1 (1 = off), got 1e-300"),
    (["--max-tokens", "2000000"], "max_tokens must be from 1 to 1,000,000, got 2000000")])
def test_values_no_reply_can_use_are_refused_before_the_app_opens(capsys, ckpt, monkeypatch, argv, says):
    """Issue 31, section 4: accepted before, and then every reply failed (or was NaN noise)."""
    from chat_app.app import ChatApp

    monkeypatch.setattr(ChatApp, "run", lambda self: pytest.fail("the app opened"))
    assert says in run_main(capsys, "--model", str(ckpt), *argv)


@pytest.mark.parametrize("what", ["folder", "file"])
def test_an_unreadable_model_is_one_line_and_exit_2(capsys, ckpt, tmp_path, monkeypatch, what):
    """A folder or file that cannot be read was `fatal: PermissionError`, exit code 1. Its mode
    is 000; where this runs as root (which reads anyway), os.stat and open refuse what the
    kernel refuses any other user: what is inside the folder, the file's contents."""
    import builtins
    import shutil

    path = tmp_path / "model"
    if what == "folder":
        shutil.copytree(ckpt, path)
    else:
        path = path.with_suffix(".gguf")
        path.write_bytes(b"GGUF" + bytes(60))
    path.chmod(0)
    if os.geteuid() == 0:
        real_stat, real_open = os.stat, builtins.open

        def refused(p) -> bool:
            return isinstance(p, (str, Path)) and (Path(p).parent == path if what == "folder" else Path(p) == path)

        def stat(p, *args, **kwargs):
            if what == "folder" and refused(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real_stat(p, *args, **kwargs)

        def open_(p, *args, **kwargs):
            if refused(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real_open(p, *args, **kwargs)

        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(builtins, "open", open_)
    try:
        err = run_main(capsys, "--model", str(path))
    finally:
        monkeypatch.undo()
        path.chmod(0o755)
    assert "cannot read the model at " in err and "Permission denied" in err, err


def test_a_broken_gguf_is_refused_before_the_window_opens(tmp_path):
    """Issue 52, defect 6: a truncated GGUF, and one whose header claims 2^40 tensors, passed the
    check before the window (it read the metadata only) and were refused by the loader after the
    window had opened ("Opening half…", then the error). Now `tinyllm-chat --model BROKEN.gguf`, run
    as a command with no terminal, says one line and exits 2 at the check; the intact file passes
    it and is refused only for want of a terminal, which is checked after the model."""
    pytest.importorskip("gguf")
    from tests.tinyllm.test_gguf import sp_kv, tiny, write_gguf
    from tinyllm.tools.testing import make_tiny_tokenizer

    tok = make_tiny_tokenizer(tmp_path)
    good = tmp_path / "good.gguf"
    write_gguf(good, tiny(tok.vocab_size, tie=True), {}, sp_kv(tok))
    data = good.read_bytes()
    half = tmp_path / "half.gguf"
    half.write_bytes(data[: len(data) // 2])  # the header whole, half the tensors' data
    many = tmp_path / "many.gguf"
    many.write_bytes(data[:8] + (2**40).to_bytes(8, "little") + data[16:])  # magic, version, then the count
    env = {**os.environ, "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "data"),
           "TINYLLM_CHAT_CONFIG_DIR": str(tmp_path / "config")}

    def run(path: Path) -> str:
        out = subprocess.run([str(Path(sys.executable).with_name("tinyllm-chat")), "--model", str(path)],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("tinyllm-chat: error: "), out.stderr
        return out.stderr

    assert "not a terminal" in run(good)  # the model passed every check made before the window
    assert f"{half} is truncated: tensor " in run(half)
    assert f"{many} is truncated or corrupt: its header claims 1,099,511,627,776 tensors" in run(many)
