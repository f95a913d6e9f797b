"""Which model a saved chat reopens with: `--resume` and the chat list (Ctrl+O) alike.

Contract: a chat keeps where its model is (chat_app.store: `model_path`, and `model_spec` for
a model from the Hub, or a server's URL#MODEL: chat_app.server_api; a server has no path).
`locate(path, spec) -> (model, why)`: `path` while tinyllm.formats.model_files.precheck still
passes it, else the Hub `spec` (read from the Hub's cache or downloaded when it is opened) or
the server `spec` (reached when it is opened), else (None, why not: precheck's one line, or
that chat.db kept no path then). `gone(name, why, current)` is the one notice for a chat whose
model cannot be reopened: the chat goes on with `current`. Neither imports torch or textual.
"""

from __future__ import annotations

from tinyllm.formats import hub
from tinyllm.formats.model_files import precheck

NO_PATH = "chat.db kept no model paths when it was saved"


def locate(path: str | None, spec: str | None) -> tuple[str | None, str]:
    why = NO_PATH
    if path:
        try:
            precheck(path)
            return path, ""
        except (FileNotFoundError, ValueError) as e:
            why = str(e)
    if spec and (hub.is_hub(spec) or spec.startswith(("http://", "https://"))):
        return spec, ""
    return None, why


def gone(name: str, why: str, current: str) -> str:
    return f"This chat was written with {name}, which cannot be opened ({why}); it goes on with {current}."
