"""Run configs made of named dataclass sections ([data], [model], [train]) shared by every task.

A task declares its sections, e.g. ``{"data": ClassifyConfig, "model": ClassifierConfig,
"train": TrainConfig}``; field names are unique across sections, so the command line can say
``--lr 3e-4`` without naming the section. Values come, later ones winning, from the dataclass
defaults, the task's bundled preset, a user preset (TOML, with sections or flat keys), and the
command line.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.configs import ConfigBase, apply_overrides, load_toml
from attnlab.errors import UserError

PRESETS = Path(__file__).resolve().parent.parent / "presets"


def field_owner(sections: Mapping[str, type]) -> dict[str, str]:
    """Which section each field belongs to; two sections sharing a field name is a bug."""
    owner: dict[str, str] = {}
    for section, cls in sections.items():
        if not issubclass(cls, ConfigBase):
            raise TypeError(f"section {section!r}: {cls.__name__} must subclass configs.ConfigBase")
        for name in (f.name for f in dataclasses.fields(cls)):
            if name in owner:
                raise RuntimeError(f"field {name!r} is in both {owner[name]} and {section}")
            owner[name] = section
    return owner


def unknown_field(key: str, owner: Mapping[str, str], where: object) -> str:
    """The error message for a setting no section has, with the closest names."""
    close = difflib.get_close_matches(key, list(owner), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown setting {key!r} in {where}{hint} (`attnlab train TASK --help` lists them)"


def preset_file(preset: str | Path, prefix: str) -> Path:
    """A TOML path, or a bundled preset name (``small`` finds ``presets/{prefix}_small.toml``)."""
    path = Path(preset)
    if path.is_file():
        return path
    name = path.name.removesuffix(".toml")
    for candidate in (PRESETS / f"{name}.toml", PRESETS / f"{prefix}_{name}.toml"):
        if candidate.is_file():
            return candidate
    bundled = sorted(p.stem for p in PRESETS.glob(f"{prefix}*.toml"))
    raise UserError(f"--config {preset}: no such file or bundled preset; bundled: {bundled}")


def build_sections(
    sections: Mapping[str, type],
    sources: Sequence[Path],
    overrides: Mapping[str, Any],
) -> dict[str, Any]:
    """One dataclass instance per section: defaults <- each TOML source <- ``overrides``."""
    owner = field_owner(sections)
    values: dict[str, dict[str, Any]] = {name: {} for name in sections}
    layers: list[dict[str, dict[str, Any]]] = []
    for source in sources:
        layer: dict[str, dict[str, Any]] = {name: {} for name in sections}
        for key, value in load_toml(source).items():
            if key in sections and isinstance(value, dict):
                for name, item in value.items():
                    if owner.get(name) != key:
                        raise UserError(unknown_field(name, owner, f"[{key}] of {source}"))
                    layer[key][name] = item
            elif key in owner:
                layer[owner[key]][key] = value
            else:
                raise UserError(unknown_field(key, owner, source))
        layers.append(layer)
    command_line: dict[str, dict[str, Any]] = {name: {} for name in sections}
    for key, value in overrides.items():
        if key not in owner:
            raise UserError(unknown_field(key, owner, "the command line"))
        command_line[owner[key]][key] = value
    for layer in [*layers, command_line]:  # a later source wins
        for name in sections:
            values[name].update(layer[name])
    return {name: apply_overrides(cls(), values[name]) for name, cls in sections.items()}
