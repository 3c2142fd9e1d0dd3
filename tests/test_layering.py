"""Imports go one way: a module may import its own layer or the layers below, never above, and
no import cycle may appear between attnlab's units (top-level modules and sub-packages), nor
between its modules (an import inside a function counts: it hides a cycle, it does not break it).

Layers, lowest first (docs/extending.md explains them). ``data`` sits below ``models``: a
tokenizer never needs a model, while checkpoint interop (BERT, GPT-2) reads tokenizers.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "attnlab"
LAYERS: list[set[str]] = [
    {"configs", "metrics", "viz", "errors"},
    {"layers"},
    {"compress"},
    {"tensor_files", "data"},
    {"models"},
    {"interop"},
    {"finetune"},
    {"train"},
    {"runs"},
    {"infer"},
    {"tasks"},
    {"commands", "bench", "explore", "verify", "cli", "__main__", "attnlab"},
]  # fmt: skip
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """attnlab.models.gpt -> models; attnlab.cli -> cli; attnlab -> attnlab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def import_graph(src: Path = SRC) -> dict[str, set[tuple[str, str]]]:
    """unit -> {(imported unit, 'file:line')} for every `attnlab` import in ``src``."""
    graph: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "attnlab" or name.startswith("attnlab."):
                    where = f"{path.relative_to(src.parent)}:{node.lineno}"
                    graph[unit_of(module)].add((unit_of(name), where))
    return graph


def violations(graph: dict[str, set[tuple[str, str]]]) -> list[str]:
    """Upward imports and units missing from LAYERS."""
    found = []
    for unit, targets in graph.items():
        for target, where in targets:
            for name in (unit, target):
                if name not in LEVEL:
                    found.append(f"{where}: unit {name!r} has no layer; add it to LAYERS")
            if unit in LEVEL and target in LEVEL and LEVEL[target] > LEVEL[unit]:
                found.append(f"{where}: {unit} (layer {LEVEL[unit]}) imports {target} "
                             f"(layer {LEVEL[target]})")  # fmt: skip
    return sorted(set(found))


def cycles(graph: dict[str, set[tuple[str, str]]]) -> list[list[str]]:
    """Every cycle between units, found by depth-first search (each reported once)."""
    edges = {u: {t for t, _ in ts if t != u} for u, ts in graph.items()}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append([*cycle, nxt])
            else:
                walk(nxt, [*path, nxt])

    for start in sorted(edges):
        walk(start, [start])
    return found


def module_name(path: Path, src: Path) -> str:
    """src/attnlab/runs/load.py -> attnlab.runs.load; .../tasks/__init__.py -> attnlab.tasks."""
    rel = path.relative_to(src.parent).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


def imported_modules(node: ast.AST, package: str, modules: set[str]) -> list[str]:
    """The attnlab modules one import statement loads: ``from P import N`` is P.N when that is a
    module, else P; relative imports are resolved against ``package``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    return [m for m in found if m in modules]


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the attnlab modules it imports anywhere in its file (functions included)."""
    paths = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            graph[module] |= set(imported_modules(node, package, set(paths))) - {module}
    return graph


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), as [a, b, ..., a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = {stack.pop()}
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth-first inside the group)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_no_layer_imports_a_layer_above_it() -> None:
    assert violations(import_graph()) == []


def test_no_import_cycle_between_units() -> None:
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_modules() -> None:
    assert module_cycles(module_graph()) == []


def test_the_module_check_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "attnlab"
    (pkg / "tasks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks" / "__init__.py").write_text("")
    (pkg / "tasks" / "a.py").write_text("from attnlab.tasks.b import f\n")
    (pkg / "tasks" / "b.py").write_text("from . import c\n")
    (pkg / "tasks" / "c.py").write_text("def g():\n    from attnlab.tasks import a\n")
    (pkg / "tasks" / "d.py").write_text("import attnlab.tasks.a\n")  # outside the cycle
    assert module_cycles(module_graph(pkg)) == [
        ["attnlab.tasks.a", "attnlab.tasks.b", "attnlab.tasks.c", "attnlab.tasks.a"]
    ]
    (pkg / "tasks" / "c.py").write_text("def g():\n    return 1\n")
    assert module_cycles(module_graph(pkg)) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checker itself fails on an upward import and on a cycle (so the tests above can)."""
    pkg = tmp_path / "attnlab"
    (pkg / "models").mkdir(parents=True)
    (pkg / "layers").mkdir()
    (pkg / "layers" / "attention.py").write_text("from attnlab.models import gpt\n")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "gpt.py").write_text("import attnlab.layers.attention\n")
    graph = import_graph(pkg)
    assert any("layers (layer 1) imports models (layer 4)" in v for v in violations(graph))
    assert cycles(graph) == [["layers", "models", "layers"]]
    (pkg / "newthing.py").write_text("import attnlab.cli\n")
    assert any("'newthing' has no layer" in v for v in violations(import_graph(pkg)))


@pytest.mark.parametrize("unit", sorted(LEVEL))
def test_every_layer_unit_exists(unit: str) -> None:
    exists = (SRC / f"{unit}.py").exists() or (SRC / unit).is_dir() or unit == "attnlab"
    assert exists, f"{unit} is in LAYERS but not in src/attnlab"


def test_no_task_imports_another_task() -> None:
    """A task's modules (the one that defines ``TASK`` and the modules only it uses) never
    import another task's module: what two tasks share lives in a lower layer."""
    graph = module_graph()
    tasks = {
        m for m in graph
        if m.startswith("attnlab.tasks.")
        and "\nTASK = " in (SRC.parent / (m.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    }  # fmt: skip
    assert len(tasks) >= 6
    found = [
        f"{m} imports {t}"
        for m in sorted(graph) if m.startswith("attnlab.tasks.")
        for t in sorted(graph[m] & tasks) if t != m
    ]  # fmt: skip
    assert found == []
