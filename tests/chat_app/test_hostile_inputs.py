"""Issue 46, item 7: hostile inputs found that round, each with the test that failed before its fix.
The config file (/theme's edit, nesting), the command line (--threads, --max-len, no terminal),
the chat list at 100,000 chats, typed input's per-key work, SIGTSTP/SIGCONT, and lines that
confused (a prompt that fits, a 300-character /export name)."""

from __future__ import annotations

import tomllib

import pytest

from chat_app import config
from chat_app.__main__ import main
from tests.chat_app.conftest import loaded, notes, send

pytestmark = pytest.mark.anyio
SIZE = (100, 30)

SYSTEM = 'system = """Be brief.\ntheme = "nord" is my favourite line\n[not a table]\n"""\n'


def test_theme_is_saved_as_a_key_never_inside_a_string():
    """Before: `^theme\\s*=.*$` over the raw text rewrote the line inside the system prompt
    (data loss), and no theme key was written."""
    file = config.path()
    file.parent.mkdir(parents=True)
    text = "# my settings\n" + SYSTEM + "temperature = 0.5  # warm\n\n[extra]\ntheme = 'x'\n"
    file.write_text(text)
    config.save("theme", "gruvbox")
    after = file.read_text()
    assert after == 'theme = "gruvbox"\n' + text  # every other byte kept
    assert tomllib.loads(after)["system"] == tomllib.loads(SYSTEM)["system"]
    config.save("theme", "nord")  # the key now there: its line rewritten, in place
    assert file.read_text() == 'theme = "nord"\n' + text
    file.write_bytes(b'temperature = 0.5\n"theme" = "nord"   # the one I like\r\nseed = 1\n')
    config.save("theme", "gruvbox")
    assert file.read_bytes() == b'temperature = 0.5\n"theme" = "gruvbox"   # the one I like\r\nseed = 1\n'
    file.write_text('theme = "a"\ntheme = "b"\n')  # not TOML: refused, nothing written
    with pytest.raises(ValueError, match="is not TOML"):
        config.save("theme", "nord")
    assert file.read_text() == 'theme = "a"\ntheme = "b"\n'


async def test_slash_theme_keeps_the_system_prompt(make_app):
    config.path().parent.mkdir(parents=True)
    config.path().write_text(SYSTEM)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/theme gruvbox")
        assert app.theme == "gruvbox" and notes(app)[-1].startswith("Theme gruvbox (kept in ")
    assert config.path().read_text() == 'theme = "gruvbox"\n' + SYSTEM
    assert config.load()["theme"] == "gruvbox"


@pytest.mark.parametrize("nested", ["a = " + "[" * 500 + "]" * 500, "a = " + "{b = " * 500 + "1" + "}" * 500],
                         ids=["arrays", "inline-tables"])
@pytest.mark.parametrize("argv", [[], ["--help"]], ids=["run", "help"])
def test_a_config_nested_500_deep_is_one_line_and_exit_2(capsys, nested, argv):
    config.path().parent.mkdir(parents=True)
    config.path().write_text(nested + "\n")
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"tinyllm-chat: error: config file {config.path()}: nested too deep to " \
                                        "read; fix it or move it away\n"


def one_line(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("tinyllm-chat: error: "), err
    return err


@pytest.mark.parametrize("threads", ["100000", "0", "-3"])
def test_threads_beyond_the_cores_are_one_line_naming_the_range(capsys, ckpt, monkeypatch, threads):
    """Before: 100000 was accepted; the model process exhausted the process limit and crashed."""
    import chat_app.__main__ as cli
    from chat_app.app import ChatApp

    monkeypatch.setattr(ChatApp, "run", lambda self: pytest.fail("the app opened"))
    err = one_line(capsys, "--model", str(ckpt), "--threads", threads)
    assert f"--threads must be from 1 to {cli.cores()} (the cores this process may use), got {threads}" in err


def test_no_terminal_is_one_line_and_exit_2(ckpt, tmp_path):
    """Before: `tinyllm-chat </dev/null >out` never ended and wrote escape codes into `out`.
    --help needs no terminal."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "data"),
           "TINYLLM_CHAT_CONFIG_DIR": str(tmp_path / "config")}
    argv = [sys.executable, "-m", "chat_app", "--model", str(ckpt), "--compile", "off"]
    with open(tmp_path / "out", "wb") as out:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, env=env,
                              timeout=120)
    assert done.returncode == 2 and (tmp_path / "out").read_bytes() == b""
    assert done.stderr.decode() == ("tinyllm-chat: error: stdin, stdout and stderr are not a terminal: tinyllm-chat is "
                                    "a full-screen app; run it in a terminal, without redirections\n")
    helped = subprocess.run([*argv, "--help"], stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=120)
    assert helped.returncode == 0 and b"--threads" in helped.stdout
