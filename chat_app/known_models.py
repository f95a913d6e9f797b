"""The models known here: what /model, Tab and the palette offer.

Contract: `known_models(store, folder)`: (name, what /model takes) for the models folder's
models (each folder in it) and those saved chats were written with (newest first; a local
one only while it is still there), each once. `offered_models(store, servers, session)`:
those, then config.toml's [servers] by NAME, then the open server's models (as URL#MODEL),
each once. A store that cannot be read gives no saved chats' models, never an error.
Imports neither Textual nor torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat_app.shipped_models import DEFAULT_MODEL
from chat_app.store import StoreError

if TYPE_CHECKING:
    from chat_app.store import Store
    from tinyllm.session.session_protocol import ModelProcess


def models_folder() -> Path:
    """Where the shipped models are: the folder that holds the default model."""
    return DEFAULT_MODEL.parent


def known_models(store: Store, folder: Path | None = None) -> list[tuple[str, str]]:
    folder = models_folder() if folder is None else folder
    found: dict[str, tuple[str, str]] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.is_dir() and not entry.name.startswith((".", "_")):
            found.setdefault(str(entry.resolve()), (entry.name, str(entry)))
    try:
        used = store.models()
    except StoreError:
        used = []
    for name, where in used:
        remote = where.startswith(("hf:", "http://", "https://"))
        key = where if remote else str(Path(where).resolve())
        if remote or os.path.exists(where):
            found.setdefault(key, (name, where))
    return list(found.values())


def offered_models(store: Store, servers: dict[str, dict[str, Any]],
                   session: ModelProcess | None) -> list[tuple[str, str]]:
    found = dict((where, name) for name, where in known_models(store))
    for name, table in servers.items():
        found.setdefault(name, f"server {table.get('url', '')}")
    if session is not None and session.capabilities.served:
        url = session.path.partition("#")[0]
        for model in getattr(session, "models", []):
            found.setdefault(f"{url}#{model}", model)
    return [(name, where) for where, name in found.items()]
