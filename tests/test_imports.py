"""The project's modules import each other without a cycle: layers only go down.

Every module of tinyllm and chat_app is parsed (not imported) with `ast`; every import of a
project module counts, at module level, inside a function, and under `if TYPE_CHECKING:` too:
a lazy import inside a function still runs, and a type-only import still says the importer
knows the module, so a cycle through either is still a cycle (chat_app's eleven parts once
held the App, and each other, through TYPE_CHECKING imports the test did not count). Break a
cycle by moving the shared piece down into a lower module. `runtime_imports` (outside
TYPE_CHECKING) is what the layer rule reads: a type named in a signature may come from above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tinyllm", "chat_app")


def project_modules() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its own name)."""
    mods = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in tree, outside the body of `if TYPE_CHECKING:` (its else counts)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def imported_modules(name: str, path: Path, mods: dict[str, Path], type_checking: bool = True) -> set[str]:
    """The project modules that module `name` imports (type_checking False: at run time only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in all_imports(tree) if type_checking else runtime_imports(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from . import x / from ..y import z
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub; `from mod import obj` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for target in targets:
            while target and target not in mods:  # `import tinyllm.x.y` where y is not a module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    mods = project_modules()
    return {name: imported_modules(name, path, mods, type_checking) for name, path in sorted(mods.items())}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of graph as [a, b, ..., a], or None (depth-first search, colouring nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "tinyllm" in graph and "tinyllm.model" in graph and "chat_app.widgets.conversation" in graph
    assert "tinyllm.decode.compile_child" in graph["tinyllm.decode.background_compile"], "a module-level import"
    assert "tinyllm.decode.compile_step" in graph["tinyllm.decode.compile_child"], "an import inside a function"


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imports_outside_type_checking_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "def f():\n    import c\n")
    assert [n.names[0].name for n in runtime_imports(tree) if isinstance(n, ast.Import)] == ["b", "c"]


def test_a_type_checking_import_is_an_edge(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tinyllm.b\n")
    mods = {"tinyllm.a": tmp_path / "a.py", "tinyllm.b": tmp_path / "a.py"}
    assert imported_modules("tinyllm.a", mods["tinyllm.a"], mods) == {"tinyllm.b"}
    assert imported_modules("tinyllm.a", mods["tinyllm.a"], mods, type_checking=False) == set()


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle (move the shared piece down into a lower module): " + " -> ".join(cycle)


# tinyllm's layers, bottom first: a module may import its own layer and those below, never above.
LAYERS = (("kernels", "text", "families"), ("core",), ("formats",), ("decode",), ("session",), ("tools",))
# The seed's three modules live where the seed names them (tinyllm/model.py, ...), each in a layer.
SEED_MODULES = {"model": "core", "kv_cache": "core", "cuda_graph": "decode"}


def layer_of(module: str) -> int | None:
    """The rank of module's layer (0 = bottom); chat_app sits above every layer; None: in no layer."""
    parts = module.split(".")
    if parts[0] == "chat_app":
        return len(LAYERS)
    if len(parts) < 2:
        return None
    folder = SEED_MODULES.get(parts[1], parts[1]) if len(parts) == 2 else parts[1]
    return next((rank for rank, names in enumerate(LAYERS) if folder in names), None)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of graph that goes up a layer, as "importer -> imported"."""
    return [f"{name} -> {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if target != "tinyllm" and name != "tinyllm" and layer_of(target) is not None
            and layer_of(name) is not None and layer_of(target) > layer_of(name)]


def test_every_tinyllm_module_lives_in_a_layer():
    loose = [name for name in import_graph() if name.startswith("tinyllm.") and layer_of(name) is None]
    assert loose == []


def test_upward_imports_finds_one():
    graph = {"tinyllm.model": {"tinyllm.kernels.qgemv"}, "tinyllm.kernels.qgemv": {"tinyllm.decode.engine"}}
    assert upward_imports(graph) == ["tinyllm.kernels.qgemv -> tinyllm.decode.engine"]


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph(type_checking=False)) == []


def unresolved_imports(mods: dict[str, Path]) -> list[str]:
    """Each import of a project module that names no module there (a module moved or renamed
    and an import left behind): `import a.b` or `from a.b import c` with no a.b, and `from pkg
    import name` where pkg is a package whose __init__ defines no name and has no submodule name."""
    bad = []
    for name, path in sorted(mods.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] in PACKAGES]
                bad += [f"{name}: import {t}" for t in targets if t not in mods]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in PACKAGES:
                if node.module not in mods:
                    bad.append(f"{name}: from {node.module}")
                    continue
                init = mods[node.module]
                if init.name != "__init__.py":
                    continue
                defined = {n.id for n in ast.walk(ast.parse(init.read_text())) if isinstance(n, ast.Name)} | {
                    n.name for n in ast.walk(ast.parse(init.read_text()))
                    if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.alias)}
                bad += [f"{name}: from {node.module} import {a.name}" for a in node.names
                        if f"{node.module}.{a.name}" not in mods and a.name not in defined]
    return bad


def test_unresolved_imports_finds_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    init, user = tmp_path / "pkg" / "__init__.py", tmp_path / "user.py"
    init.write_text('"""A package."""\n')
    user.write_text("from tinyllm import gone\nimport tinyllm.nowhere\nfrom tinyllm.core import model\n")
    mods = {"tinyllm": init, "tinyllm.core": init, "tinyllm.core.model": init, "tinyllm.user": user}
    assert unresolved_imports(mods) == ["tinyllm.user: from tinyllm import gone", "tinyllm.user: import tinyllm.nowhere"]


def test_every_project_import_names_a_module_that_is_there():
    assert unresolved_imports(project_modules()) == []
