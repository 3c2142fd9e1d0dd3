"""No module outside models/ recognises a model by its name.

A model is found through the registry (``models.registry``: its entry, its family, whether it has
published weights) or by its type, never by comparing a name such as ``arch == "deit"`` or
``init == E5``: a new model is then one module and one registry entry, and nothing elsewhere
needs to learn its name. The check reads every module's syntax tree: a comparison (``==``,
``!=``, ``in``, ``not in``) of an expression that names a model (an ``arch``, ``init``,
``checkpoint``, ``family`` or ``name``) with a registered model's name, written out or imported
from a models module, is a violation.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from attnlab.models.registry import list_models

SRC = Path(__file__).resolve().parent.parent / "src" / "attnlab"
HINTS = ("arch", "init", "checkpoint", "family", "spec")  # what names a model in an expression


def names_a_model(node: ast.expr) -> bool:
    """Whether an expression's text reads as a model's name (``cfg.arch``, ``name``, ...)."""
    text = ast.unparse(node).lower()
    return any(hint in text for hint in HINTS) or text == "name"


def model_constants(tree: ast.Module, names: set[str]) -> set[str]:
    """Local names bound by ``from attnlab.models.X import C [as D]`` to a model's name."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnlab.models"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if isinstance(value, str) and value in names:
                    bound.add(alias.asname or alias.name)
    return bound


def literals(node: ast.expr, names: set[str], constants: set[str]) -> list[str]:
    """The model names ``node`` holds: a string, an imported constant, or a tuple/list/set of
    them."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    found = []
    for item in items:
        if isinstance(item, ast.Constant) and item.value in names:
            found.append(item.value)
        elif isinstance(item, ast.Name) and item.id in constants:
            found.append(item.id)
    return found


def comparisons(src: Path, names: set[str]) -> list[str]:
    """'file:line: expression' for every comparison outside models/ of a model's name."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[0] == "models":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = model_constants(tree, names)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for a, b in zip(sides, sides[1:]):
                for value, other in ((a, b), (b, a)):
                    if literals(value, names, constants) and names_a_model(other):
                        where = f"{path.relative_to(src.parent)}:{node.lineno}"
                        found.append(f"{where}: {ast.unparse(node)}")
    return sorted(set(found))


def test_no_module_outside_models_compares_a_model_name() -> None:
    assert comparisons(SRC, set(list_models())) == []


@pytest.mark.parametrize(
    "code",
    [
        'if cfg.arch == "deit":\n    pass\n',
        'ok = arch not in ("bert", "albert")\n',
        'from attnlab.models.e5 import NAME as E5\nok = dcfg.init == E5\n',
        'ok = "minilm" == name\n',
    ],
)
def test_the_check_sees_each_way_of_naming_a_model(tmp_path: Path, code: str) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "x.py").write_text(code)
    assert len(comparisons(tmp_path, set(list_models()))) == 1
    (tmp_path / "tasks" / "x.py").write_text('ok = tokenizer_kind == "char"\n')
    assert comparisons(tmp_path, set(list_models())) == []
