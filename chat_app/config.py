"""The user's config file: defaults for the command line, in TOML.

Where: `$TINYLLM_CHAT_CONFIG_DIR/config.toml` if that is set (tests point it at a tmp dir),
else `config.toml` in `platformdirs.user_config_dir("tinyllm-chat")`. Missing: no defaults.

Contract: `load()` returns {option: value} for argparse's `set_defaults`, so an option given on
the command line wins over the file, and the file over the built-in default. Top-level keys
only, named as the options are (`max_tokens` or `max-tokens`): model, device, max_len,
temperature, top_p, top_k, repeat_penalty, dry_multiplier, dry_base, dry_allowed_length,
dry_last_n, repeat_stop (0: off), max_tokens, seed, system, template, theme, and
context_budget (the share of free memory a full context's K/V may take: tinyllm.session.context).
One table, `[servers.NAME]`, names OpenAI-compatible servers for `--model NAME` and `/model NAME`
(returned as {"servers": {NAME: {...}}}): `url` (http(s)://HOST:PORT/v1, required), `model` (the
one to use where NAME has no #MODEL; default: the server's first), `api_key` (a reference to
the key, never the key: "${VAR}" or "keyring"; chat_app.api_keys refuses a key written here,
saying what to write instead) and `timeout` (seconds the server may say nothing mid-reply).
A file that is not TOML, an unknown key, a value of the wrong type or a sampling value out of
range (tinyllm.decode.sampling_params.check, as for the command line and /set) is a ValueError
naming the file, the key and what is wanted (the CLI prints it as its one-line error). `save(name,
value)` sets one top-level key (the app's /theme), keeping the rest of the file as written.
This module imports no torch and no textual.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tinyllm.decode.sampling_params import LIMITS, check

ENV_DIR = "TINYLLM_CHAT_CONFIG_DIR"
KEYS: dict[str, type | tuple[type, ...]] = {  # key: the TOML types it takes
    "model": str, "device": str, "max_len": int, "temperature": (float, int), "top_p": (float, int),
    "top_k": int, "repeat_penalty": (float, int), "dry_multiplier": (float, int), "dry_base": (float, int),
    "dry_allowed_length": int, "dry_last_n": int, "repeat_stop": int, "max_tokens": int, "seed": int, "system": str,
    "template": str, "theme": str, "context_budget": (float, int)}


def path() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser() / "config.toml"
    from platformdirs import user_config_dir

    return Path(user_config_dir("tinyllm-chat")) / "config.toml"


def load(file: Path | None = None) -> dict[str, object]:
    file = file or path()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"config file {file}: {e}; fix it or move it away") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
        raise ValueError(f"config file {file}: nested too deep to read; fix it or move it away") from None
    out: dict[str, object] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "servers":
            out["servers"] = servers(value, file)
            continue
        if name not in KEYS:
            raise ValueError(f"config file {file}: unknown setting {key!r}; one of {', '.join(KEYS)}")
        kinds = KEYS[name]
        if isinstance(value, bool) or not isinstance(value, kinds):
            want = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise ValueError(f"config file {file}: {key} must be a {want}, got {value!r}")
        if name in LIMITS:
            try:
                check(name, value)
            except ValueError as e:
                raise ValueError(f"config file {file}: {e}") from None
        if name == "context_budget" and not 0 < value <= 1:
            raise ValueError(f"config file {file}: context_budget is a share of free memory, "
                             f"0 < context_budget <= 1, got {value!r}")
        out[name] = os.path.expanduser(value) if name == "model" and value.startswith("~") else value
    return out


SERVER_KEYS: dict[str, type | tuple[type, ...]] = {"url": str, "model": str, "api_key": str, "timeout": (float, int)}


def servers(value: object, file: Path) -> dict[str, dict[str, object]]:
    """The [servers] table, each entry checked (see the module's contract)."""
    from chat_app.api_keys import check_reference
    from chat_app.server_api import base_url

    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"config file {file}: servers is a table of tables: [servers.NAME] with url = \"http://...\"")
    for name, table in value.items():
        where = f"config file {file}: [servers.{name}]"
        for key, item in table.items():
            if key not in SERVER_KEYS:
                raise ValueError(f"{where}: unknown key {key!r}; one of {', '.join(SERVER_KEYS)}")
            if isinstance(item, bool) or not isinstance(item, SERVER_KEYS[key]):
                raise ValueError(f"{where}: {key} must be a {getattr(SERVER_KEYS[key], '__name__', 'number')}")
        if "url" not in table:
            raise ValueError(f"{where}: url is missing (url = \"http://HOST:PORT/v1\")")
        try:
            base_url(table["url"])
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if "api_key" in table:
            check_reference(table["api_key"], where)
        if "timeout" in table and not 0 < table["timeout"] <= 3600:
            raise ValueError(f"{where}: timeout is seconds, from 0 to 3600")
        if "#" in name or "/" in name or ":" in name:
            raise ValueError(f"{where}: a server's name holds no '#', '/' or ':'")
    return value


def save(name: str, value: str, file: Path | None = None) -> Path:
    """Set the top-level key `name = "value"`, keeping every other byte of the file: the line
    that holds the key now is rewritten (its comment kept), else the key goes on a line of its
    own at the top (always top level). The edit is checked by parsing: the result must be the
    file as it was read with only that key changed, so a `theme = ...` line inside a multi-line
    string or under a [table] is never touched. ValueError when the file is not TOML (nothing
    is written), OSError when it cannot be written."""
    file = file or path()
    text = file.read_bytes().decode("utf-8") if file.exists() else ""  # bytes: \r\n stays \r\n
    try:
        before = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        raise ValueError(f"config file {file} is not TOML; fix it or move it away") from None
    want = {**before, name: value}
    for new in _edits(text, name, value):
        try:
            if tomllib.loads(new) == want:
                break
        except tomllib.TOMLDecodeError:
            continue
    else:
        raise ValueError(f"config file {file}: could not set {name} in it; set {name} = {_quote(value)} by hand")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(new.encode("utf-8"))
    return file


def _edits(text: str, name: str, value: str) -> Iterator[str]:
    """Candidate files, each one line changed: every line that looks like the key's, with the
    value replaced (and then the whole line), then the key added at the top."""
    key = rf"(?:{re.escape(name)}|\"{re.escape(name)}\"|'{re.escape(name)}')"
    for m in re.finditer(rf"^([ \t]*{key}[ \t]*=[ \t]*)([^\r\n]*)(?=\r?\n|\Z)", text, re.MULTILINE):
        comment = re.search(r"[ \t]+#[^\"']*$", m.group(2))
        for tail in ([comment.group(0)] if comment else []) + [""]:
            yield text[:m.start()] + m.group(1) + _quote(value) + tail + text[m.end():]
    yield f"{name} = {_quote(value)}\n" + text


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
