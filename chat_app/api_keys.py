"""API keys for OpenAI-compatible servers: where a key may come from, and the one rule for
which server it goes to.

Contract:
- A key is never plain text in config.toml. A `[servers.NAME]` table's `api_key` is a
  reference: `"${VAR}"` (the environment variable VAR, read when the server is opened) or
  `"keyring"` (the system keyring's password for service "tinyllm-chat" and user NAME, where
  the `keyring` package is importable; it is not a dependency). `check_reference` refuses
  anything else in one line that says what to write instead; a URL that carries a user or
  password (`https://user:key@host`) is refused the same way.
- The rule: a key goes only to the server it was given for.
    * a `[servers.NAME]` key goes to that table's `url`, whether the server is opened as
      `NAME` or by that exact URL (scheme, host, port and path);
    * `TINYLLM_CHAT_API_KEY` goes only to the server named by `--model` on the same command
      line (a URL or a NAME without a key of its own); never to a server opened later with
      /model, nor to a saved chat's server that --resume reopens;
    * nothing else is read: OPENAI_API_KEY and the like are sent only where a table says
      `api_key = "${OPENAI_API_KEY}"`.
- `resolve(reference, name)` returns the key, or raises ValueError saying which variable or
  keyring entry is missing. A key is held only in memory (`Secret`: its repr and str hide it),
  never written to chat.db, the log, an export or the screen.
This module imports no torch and no textual.
"""

from __future__ import annotations

import os
import re

ENV_KEY = "TINYLLM_CHAT_API_KEY"  # the --model server's key, for a server without a table of its own
KEYRING = "keyring"
KEYRING_SERVICE = "tinyllm-chat"
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
HOW = ('put the key in an environment variable and write api_key = "${VAR_NAME}", or store it in the '
       'system keyring (service "tinyllm-chat", user the server\'s name) and write api_key = "keyring"')


class Secret:
    """A key, held in memory only: its repr and str never show it; `reveal()` is for the
    Authorization header and nothing else."""

    __slots__ = ("_key",)

    def __init__(self, key: str) -> None:
        self._key = key

    def reveal(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._key == self._key

    __hash__ = None  # type: ignore[assignment]


def check_reference(value: object, where: str) -> None:
    """ValueError unless `value` is a key reference ("${VAR}" or "keyring"), never a key."""
    if not isinstance(value, str) or not (value == KEYRING or _REFERENCE.fullmatch(value)):
        raise ValueError(f"{where}: api_key holds the key itself (never kept in plain text); {HOW}")


def resolve(reference: str, name: str) -> Secret:
    """The key a reference names (see check_reference); ValueError when it is not there."""
    if reference == KEYRING:
        try:
            import keyring  # optional: not a dependency
        except ImportError:
            raise ValueError(f'server {name}: api_key = "keyring" needs the keyring package '
                             "(pip install keyring), or use an environment variable") from None
        try:
            key = keyring.get_password(KEYRING_SERVICE, name)
        except Exception as e:  # a keyring backend's own failure (locked, none installed)
            raise ValueError(f"server {name}: the system keyring could not be read ({type(e).__name__})") from None
        if not key:
            raise ValueError(f'server {name}: no key in the system keyring for service "{KEYRING_SERVICE}", '
                             f'user "{name}" (keyring set {KEYRING_SERVICE} {name})')
        return _checked(key.strip(), f"the system keyring (server {name})")
    m = _REFERENCE.fullmatch(reference)
    assert m, f"an unchecked api_key reference for {name}"
    key = os.environ.get(m.group(1), "").strip()
    if not key:
        raise ValueError(f"server {name}: api_key names the environment variable {m.group(1)}, which is not set")
    return _checked(key, f"{m.group(1)} (server {name})")


def from_environment() -> Secret | None:
    """TINYLLM_CHAT_API_KEY, for the --model server only (see the rule above)."""
    key = os.environ.get(ENV_KEY, "").strip()
    return _checked(key, ENV_KEY) if key else None


def _checked(key: str, source: str) -> Secret:
    """The key as a Secret, surrounding whitespace gone; ValueError naming where it came from
    (never the key) when it cannot go into an HTTP header: not printable ASCII."""
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        raise ValueError(f"the API key from {source} holds a space, a control or a non-ASCII character; "
                         "an HTTP header cannot carry it")
    return Secret(key)
