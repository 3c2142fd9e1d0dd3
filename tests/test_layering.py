"""Imports go one way: a module may import its own layer or the layers below, never above, and
no import cycle may appear between attnlab's units (top-level modules and sub-packages).

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
    {"configs", "attention", "flash", "flash_triton", "quant", "positions", "efficient", "blocks",
     "channel", "ssm", "ssm_cpp", "rwkv", "moe", "metrics", "viz", "tensor_files", "errors"},
    {"data"},
    {"models"},
    {"train"},
    {"tasks"},
    {"bench", "explore", "verify", "cli", "__main__", "attnlab"},
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


def test_no_layer_imports_a_layer_above_it() -> None:
    assert violations(import_graph()) == []


def test_no_import_cycle_between_units() -> None:
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checker itself fails on an upward import and on a cycle (so the tests above can)."""
    pkg = tmp_path / "attnlab"
    (pkg / "models").mkdir(parents=True)
    (pkg / "attention.py").write_text("from attnlab.models import gpt\n")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "gpt.py").write_text("import attnlab.attention\n")
    graph = import_graph(pkg)
    assert any("attention (layer 0) imports models (layer 2)" in v for v in violations(graph))
    assert cycles(graph) == [["attention", "models", "attention"]]
    (pkg / "newthing.py").write_text("import attnlab.cli\n")
    assert any("'newthing' has no layer" in v for v in violations(import_graph(pkg)))


@pytest.mark.parametrize("unit", sorted(LEVEL))
def test_every_layer_unit_exists(unit: str) -> None:
    exists = (SRC / f"{unit}.py").exists() or (SRC / unit).is_dir() or unit == "attnlab"
    assert exists, f"{unit} is in LAYERS but not in src/attnlab"
