"""The user's config file: defaults for the command line, in TOML.

Where: `$TINYLLM_CHAT_CONFIG_DIR/config.toml` if that is set (tests point it at a tmp dir),
else `config.toml` in `platformdirs.user_config_dir("tinyllm-chat")`. Missing: no defaults.

Contract: `load()` returns {option: value} for argparse's `set_defaults`, so an option given on
the command line wins over the file, and the file over the built-in default. Top-level keys
only, named as the options are (`max_tokens` or `max-tokens`): model, device, max_len,
temperature, top_p, top_k, repeat_penalty, max_tokens, seed, system, template, theme.
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
from pathlib import Path

from tinyllm.decode.sampling_params import LIMITS, check

ENV_DIR = "TINYLLM_CHAT_CONFIG_DIR"
KEYS: dict[str, type | tuple[type, ...]] = {  # key: the TOML types it takes
    "model": str, "device": str, "max_len": int, "temperature": (float, int), "top_p": (float, int),
    "top_k": int, "repeat_penalty": (float, int), "max_tokens": int, "seed": int, "system": str,
    "template": str, "theme": str}


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
    out: dict[str, object] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
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
        out[name] = Path(value).expanduser() if name == "model" else value
    return out


def save(name: str, value: str, file: Path | None = None) -> Path:
    """Set `name = "value"` at the top of the file (replacing the key where it is); OSError
    when it cannot be written."""
    file = file or path()
    line = f"{name} = {_quote(value)}"
    text = file.read_text(encoding="utf-8") if file.exists() else ""
    pattern = re.compile(rf"^{re.escape(name)}\s*=.*$", re.MULTILINE)
    head, sep, tables = text.partition("\n[")  # top-level keys live before any [table]
    if pattern.search(head):
        head = pattern.sub(line, head, count=1)
    else:
        head = line + "\n" + head
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(head + sep + tables, encoding="utf-8")
    return file


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
