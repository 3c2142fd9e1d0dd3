"""Each bundled preset lists only what differs from what it is layered on: a key equal to the
dataclass default (where the task's own preset does not set another value) is one more place
to edit a default, which editing the dataclass would then not change."""

from __future__ import annotations

import typing

import pytest

from attnlab.configs import coerce_value, from_dict, load_toml, to_dict
from attnlab.runs import sections
from attnlab.runs.registry import REGISTRY, get_task

PRESETS = sorted(p.stem for p in sections.PRESETS.glob("*.toml"))
# keys restated on purpose: lm_baby pins every flag of nanoGPT's baby GPT command line; the
# main job's preset writes out its corpus and the fine-tuning recipe's optimizer settings, and
# the character model's its corpus
RESTATED = {
    "lm_baby": {"pos", "norm", "tie_weights", "dropout", "lr", "clip_norm"},
    "classify": {"data", "weight_decay", "clip_norm", "log_every"},
    "classify_char": {"data"},
}


def _readers(stem: str) -> list[tuple[dict, list]]:
    """The sections of each task (and architecture) that reads presets/{stem}.toml, with the
    presets it is layered on: the ones before it in the architecture's chain of bundled
    presets (``Task.presets``: classify, then classify_minilm), or, for a `--config` preset,
    the whole chain of each architecture whose settings it names."""
    out = []
    keys = set(_keys(stem))
    for name in REGISTRY:
        task = get_task(name)
        chains = {arch: task.presets(arch) for arch in task.archs or ("",)}
        if name == "classify":  # its --arch also takes a checkpoint folder
            chains["FOLDER"] = task.presets(str(sections.PRESETS))
        every = {p for chain in chains.values() for p in chain}
        for arch, chain in chains.items():
            parts = task.arch_sections(arch)
            paths = [sections.PRESETS / f"{p}.toml" for p in chain]
            if stem in chain:
                out.append((parts, paths[: chain.index(stem)]))
            elif (
                task.preset_prefix
                and stem.startswith(f"{task.preset_prefix}_")
                and stem not in every
                and keys <= set(sections.field_owner(parts))
            ):
                out.append((parts, paths))
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
    for parts, base in readers:
        cfg = sections.build_sections(parts, [*base, sections.PRESETS / f"{stem}.toml"], {})
        for name, cls in parts.items():
            assert from_dict(cls, to_dict(cfg[name])) == cfg[name]


@pytest.mark.parametrize("stem", PRESETS)
def test_no_preset_key_restates_a_default(stem: str) -> None:
    """A key restates a default when, in every chain of presets that reads the file, it sets
    the value the chain already has and that is the code's default (a `--config` preset read
    over several architectures' chains may set what one chain has and another lacks)."""
    restated = []
    for key, value in _keys(stem).items():
        readers = _readers(stem)
        for parts, base in readers:
            owner = sections.field_owner(parts)[key]
            default = parts[owner]()
            layered = sections.build_sections(parts, base, {})[owner]
            hint = typing.get_type_hints(type(default))[key]
            same = coerce_value(value, hint, key) == getattr(default, key)
            if not (same and getattr(layered, key) == getattr(default, key)):
                break
        else:
            if readers:
                restated.append(key)
    assert set(restated) <= RESTATED.get(stem, set()), (
        f"presets/{stem}.toml restates the defaults of {sorted(set(restated))}; drop them"
    )
