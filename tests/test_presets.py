"""Each bundled preset lists only what differs from what it is layered on: a key equal to the
dataclass default (where the task's own preset does not set another value) is one more place
to edit a default, which editing the dataclass would then not change."""

from __future__ import annotations

import typing

import pytest

from attnlab.configs import coerce_value, from_dict, load_toml, to_dict
from attnlab.runs import sections
from attnlab.runs.registry import REGISTRY, get_task
from attnlab.runs.task import Task

PRESETS = sorted(p.stem for p in sections.PRESETS.glob("*.toml"))
# keys restated on purpose: lm_baby pins every flag of nanoGPT's baby GPT command line, and
# bert_classify writes out the fine-tuning recipe's optimizer settings
RESTATED = {
    "lm_baby": {"pos", "norm", "tie_weights", "dropout", "lr", "clip_norm"},
    "bert_classify": {"weight_decay", "clip_norm", "log_every"},
}


def _readers(stem: str) -> list[tuple[Task, list]]:
    """Each task that reads presets/{stem}.toml, with the presets it is layered on."""
    out = []
    for name in REGISTRY:
        task = get_task(name)
        if task.preset == stem:
            out.append((task, []))
        elif task.preset_prefix and stem.startswith(f"{task.preset_prefix}_"):
            out.append((task, [sections.PRESETS / f"{task.preset}.toml"]))
    return out


def _keys(stem: str) -> dict:
    data = load_toml(sections.PRESETS / f"{stem}.toml")
    flat = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for part in (v for v in data.values() if isinstance(v, dict)):
        flat |= part
    return flat


@pytest.mark.parametrize("stem", PRESETS)
def test_every_preset_resolves_for_each_task_that_reads_it(stem: str) -> None:
    readers = _readers(stem)
    assert readers, f"presets/{stem}.toml is read by no task"
    for task, base in readers:
        cfg = sections.build_sections(
            task.sections(), [*base, sections.PRESETS / f"{stem}.toml"], {}
        )
        for name, cls in task.sections().items():
            assert from_dict(cls, to_dict(cfg[name])) == cfg[name]


@pytest.mark.parametrize("stem", PRESETS)
def test_no_preset_key_restates_a_default(stem: str) -> None:
    restated = []
    for key, value in _keys(stem).items():
        for task, base in _readers(stem):
            owner = sections.field_owner(task.sections())[key]
            default = task.sections()[owner]()
            layered = sections.build_sections(task.sections(), base, {})[owner]
            hint = typing.get_type_hints(type(default))[key]
            same = coerce_value(value, hint, key) == getattr(default, key)
            if same and getattr(layered, key) == getattr(default, key):
                restated.append(key)
                break
    assert set(restated) <= RESTATED.get(stem, set()), (
        f"presets/{stem}.toml restates the defaults of {sorted(set(restated))}; drop them"
    )
