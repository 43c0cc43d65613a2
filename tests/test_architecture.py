"""The package's shape, read from its own imports (lazy and TYPE_CHECKING ones included): folders that
follow the flow, each importing only its own layer or those below it, and no import cycle.

    api, cli -> fleet -> pipeline -> report -> checks -> engines -> catalog -> load -> the top-level modules

(`api` and `cli` are the two entry points, in-process and on the command line; neither imports the other.)

docs/architecture.md draws the same picture.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvdoctor"
# Highest first; the top-level modules (model, limits, errors, ...) are the ground floor.
LAYERS = ("api", "cli", "fleet", "pipeline", "report", "checks", "engines", "catalog", "load")
GROUND = "top"
MAX_TOP_MODULES = 10


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The kvdoctor modules `name` imports anywhere in its body: a submodule where one is named, else
    the package or module the names come from."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] == "kvdoctor":
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kvdoctor")
    return found & set(MODULES)


GRAPH = {name: imports(name) for name in MODULES}


def layer(name: str) -> str:
    """The folder right under kvdoctor/ a module lives in; `__main__` runs the command line."""
    parts = name.split(".")
    if parts[1:] == ["__main__"]:
        return "cli"
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else GROUND


def rank(name: str) -> int:
    return len(LAYERS) if layer(name) == GROUND else LAYERS.index(layer(name))


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(GRAPH[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    return found


def test_the_reader_sees_real_imports():
    """The graph is read right: known edges of the pipeline are in it (so the other tests can fail)."""
    assert "kvdoctor.engines" in GRAPH["kvdoctor.pipeline.check"]
    assert "kvdoctor.load.loader" in GRAPH["kvdoctor.pipeline.check"]
    assert "kvdoctor.engines.deploy" in GRAPH["kvdoctor.checks.context"]  # a TYPE_CHECKING import
    assert len(MODULES) > 100


def test_no_import_cycle():
    assert cycles() == []


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if rank(b) < rank(a))
    assert upward == []


@pytest.mark.parametrize("folder", LAYERS)
def test_each_layer_is_a_folder(folder):
    assert (PACKAGE / folder / "__init__.py").is_file()


def test_few_modules_at_the_top():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_two_entry_points_stay_apart():
    """The Python API and the command line both sit on the layers below; neither imports the other."""
    crossing = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                      if {layer(a), layer(b)} == {"api", "cli"})
    assert "kvdoctor.pipeline.check" in GRAPH["kvdoctor.api"]  # the reader sees the API's imports
    assert crossing == []


def names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | \
        {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_engines_produce_data_not_findings():
    """Engines return plans, observations and budgets; the rules under checks/ make the findings."""
    assert "Finding" in names_used(PACKAGE / "checks" / "vllm.py")  # the reader sees a rule's findings
    builders = sorted(name for name, path in MODULES.items()
                      if layer(name) == "engines" and "Finding" in names_used(path))
    assert builders == []


def engine_name_comparisons(source: str) -> list[int]:
    """Lines of `x == "vllm"`, `"hf" != y`, `engine in ("sglang", ...)`: a comparison with a profile's name."""
    from kvdoctor.engines import PROFILES

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & set(PROFILES)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(names(e) for e in node.elts)) if node.elts else set()
        return set()

    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Compare) and any(names(side) for side in (node.left, *node.comparators))]


def test_the_name_scan_sees_comparisons():
    assert engine_name_comparisons('a == "vllm"\nb = "vllm"\nif "hf" != c: pass\nd in ("x", "sglang-mlx")') == [1, 3, 4]


def test_only_the_engines_compare_engine_names():
    """Outside engines/, what an engine does is asked of its profile (the registry and each profile's
    declared capabilities decide), never read off its name."""
    outside = [f"{name}:{line}" for name, path in MODULES.items() if layer(name) != "engines"
               for line in engine_name_comparisons(path.read_text())]
    assert outside == []
