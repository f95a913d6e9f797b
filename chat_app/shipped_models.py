"""Where the shipped models are: `models/` of a clone, or the package `tinyllm_models` that an
install carries (a wheel, pipx, or an editable install, which maps it to the clone's models/).

Contract: `DEFAULT_MODEL` is models/tinychat there (the model tinyllm-chat opens without
--model); its folder, `DEFAULT_MODEL.parent`, holds every shipped model, one folder each (the
palette lists them). Reads nothing but the package's location; imports no torch.
"""

from __future__ import annotations

from pathlib import Path


def find_default_model() -> Path:
    """models/tinychat: from the package tinyllm_models where it is installed, else beside the
    source tree (a clone run without installing)."""
    from importlib.resources import files

    try:
        return Path(str(files("tinyllm_models") / "tinychat"))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "models" / "tinychat"


DEFAULT_MODEL = find_default_model()
