"""pyproject.toml names every package, and the top-level models/ folder as tinyllm_models.

The wheel itself is checked by .ci/run (.ci/wheel_check.py): built, its files compared with the
clone's, installed into a fresh venv and asked for a reply from the default model it carries.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for top in ("tinyllm", "chat_app") for init in (ROOT / top).rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | {"tinyllm_models"}, "list a new package in pyproject.toml"
    assert setuptools["package-dir"] == {"tinyllm_models": "models"}
    assert (ROOT / "models" / "__init__.py").is_file()


def test_the_wheel_ships_every_cpp_file_the_first_launch_builds():
    from fnmatch import fnmatch

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tinyllm.kernels"]
    sources = [p.name for ext in ("*.cpp", "*.h") for p in (ROOT / "tinyllm" / "kernels").glob(ext)]
    assert len(sources) > 3
    missing = [name for name in sources if not any(fnmatch(name, pat) for pat in patterns)]
    assert not missing, f"package-data must ship {missing}"
