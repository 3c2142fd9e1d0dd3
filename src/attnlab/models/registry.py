"""Every model attnlab builds, by name: ``create_model("vit")``, ``list_models()``.

A model module registers its own entries, either by decorating the factory (or model class)
that turns a config into a module::

    @register_model("swin", family="swin", config=SwinConfig, oracle="Swin", tiny={...})
    class Swin(nn.Module): ...

or with a registration call at the end of the module (several entries of one class: GPT and
its mixers). An entry knows its name, family, config class, how to build the model, a tiny
config for tests, the ``attnlab verify`` row that proves it (``oracle``, the row's component
name) and how to make an example input; ``tests/models/test_registry.py`` runs every entry
(forward + backward, bf16 autocast, a save/load round trip, the oracle's row exists), so a new
model is tested by registering it.

Nothing here imports a model module at import time (that would be a cycle: each module imports
this one); the first look-up imports every module of ``attnlab.models`` once, so registering
needs no list to edit.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import UserError

Example = Callable[[Any, int], tuple[Any, ...]]  # (config, batch size) -> forward's arguments


@dataclass(frozen=True)
class ModelEntry:
    """One buildable model: ``build(config(**defaults, **overrides))``."""

    name: str
    family: str
    config: type
    build: Callable[[Any], nn.Module]
    oracle: str | None  # the `attnlab verify` row's component; None: tests only (see note)
    example: Example
    defaults: Mapping[str, Any] = field(default_factory=dict)  # over the config's own
    tiny: Mapping[str, Any] = field(default_factory=dict)  # over defaults: a seconds-fast model
    also: tuple[str, ...] = ()  # further verify rows the model needs (a hybrid: both mixers)
    # the published weights and what reads text for them (a models.pretrained.Pretrained)
    load: Callable[..., Any] | None = None
    count: Callable[[nn.Module], int] | None = None  # weights of a model, when not parameters
    note: str = ""  # one line for `attnlab models`: what the oracle does not cover

    def make_config(self, tiny: bool = False, **overrides: Any) -> Any:
        """The config of this entry (its tiny one with ``tiny``), ``overrides`` applied last."""
        values = {**self.defaults, **(self.tiny if tiny else {}), **overrides}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(self.config)})
        if unknown:
            raise UserError(f"model {self.name!r}: {self.config.__name__} has no {unknown}")
        return self.config(**values)

    @property
    def oracles(self) -> tuple[str, ...]:
        """Every verify row that proves this model."""
        return (() if self.oracle is None else (self.oracle,)) + self.also

    @property
    def pretrained(self) -> bool:
        return self.load is not None


_ENTRIES: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    *,
    family: str,
    oracle: str | None,
    example: Example,
    config: type | None = None,
    build: Callable[[Any], nn.Module] | None = None,
    **fields: Any,
) -> Callable[[Any], Any]:
    """Decorate a factory or model class (``config=`` its config class) or a config class
    (``build=`` the factory); the decorated object comes back unchanged."""

    def decorate(obj: Any) -> Any:
        is_config = dataclasses.is_dataclass(obj) and isinstance(obj, type)
        cfg_class = obj if is_config else config
        factory = build if is_config else obj
        if cfg_class is None or factory is None:
            raise TypeError(f"register_model({name!r}): give config= (factory) or build= (config)")
        add_model(ModelEntry(name, family, cfg_class, factory, oracle, example, **fields))
        return obj

    return decorate


def add_model(entry: ModelEntry) -> ModelEntry:
    """Register ``entry``; a second entry of one name is refused (two modules disagree)."""
    old = _ENTRIES.get(entry.name)
    if old is not None and old != entry:
        raise ValueError(f"model {entry.name!r} is registered twice")
    _ENTRIES[entry.name] = entry
    return entry


@cache
def _discover() -> None:
    """Import every module of ``attnlab.models`` once, so each registers its entries."""
    package = importlib.import_module("attnlab.models")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "registry":
            importlib.import_module(f"attnlab.models.{info.name}")


def list_models(family: str | None = None) -> list[str]:
    """Registered names, sorted (of one family when given)."""
    _discover()
    return sorted(n for n, e in _ENTRIES.items() if family is None or e.family == family)


def model_entry(name: str) -> ModelEntry:
    """The entry of ``name``; a UserError listing the names otherwise."""
    _discover()
    if name not in _ENTRIES:
        raise UserError(f"unknown model {name!r}; one of {', '.join(list_models())}")
    return _ENTRIES[name]


def create_model(name: str, *, pretrained: bool = False, **overrides: Any) -> nn.Module:
    """The model ``name`` with its default config and ``overrides`` (random weights), or with
    ``pretrained`` its published weights (``overrides`` go to the entry's loader)."""
    if pretrained:
        return load_pretrained(name, **overrides).model
    entry = model_entry(name)
    return entry.build(entry.make_config(**overrides))


def load_pretrained(name: str, **options: Any) -> Any:
    """The published weights of ``name`` with what reads text for them: a
    :class:`~attnlab.models.pretrained.Pretrained` (``options`` go to the entry's loader, e.g.
    ``role="passage"`` for e5)."""
    entry = model_entry(name)
    if entry.load is None:
        have = ", ".join(pretrained_names()) or "none"
        raise UserError(f"model {name!r} has no pretrained weights; those that do: {have}")
    return entry.load(**options)


def pretrained_names() -> list[str]:
    """The registered models that come with published weights, sorted."""
    return [name for name in list_models() if _ENTRIES[name].pretrained]


def family_of(config: Any) -> str:
    """The family whose entries use ``config``'s class (ViT and DeiT: vit)."""
    _discover()
    families = {e.family for e in _ENTRIES.values() if type(config) is e.config}
    if len(families) != 1:
        raise UserError(f"no single model family builds a {type(config).__name__}: {families}")
    return families.pop()


def n_weights(entry: ModelEntry, model: nn.Module) -> int:
    """Weights of a built model: its parameters, or what the entry counts (a packed table)."""
    if entry.count is not None:
        return entry.count(model)
    return sum(p.numel() for p in model.parameters())


@cache
def default_size(name: str) -> int:
    """Weights of ``name``'s default config, built on the meta device (no memory, no init)."""
    entry = model_entry(name)
    with torch.device("meta"):
        return n_weights(entry, entry.build(entry.make_config()))


def _size(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def models_table(family: str | None = None) -> str:
    """``attnlab models``: name, family, weights of the default config, the verify rows."""
    rows = [("name", "family", "parameters", "oracle (attnlab verify)")]
    for name in list_models(family):
        e = model_entry(name)
        proof = "; ".join(e.oracles) or "none"
        label = f"{name} (pretrained)" if e.pretrained else name
        rows.append((label, e.family, _size(default_size(name)), proof))
        if e.note:
            rows.append(("", "", "", f"  ({e.note})"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[3]]).rstrip() for r in rows]
    return "\n".join(lines)


# Example inputs most entries share; each returns forward's positional arguments.


def tokens(vocab: str = "vocab_size", lengths: bool = False, length: int = 8) -> Example:
    """ids (B, T) in ``cfg.<vocab>`` (and lengths (B,), the first one full)."""

    def make(cfg: Any, batch: int) -> tuple[Tensor, ...]:
        ids = torch.randint(0, getattr(cfg, vocab), (batch, length))  # (B, T)
        if not lengths:
            return (ids,)
        return ids, torch.randint(1, length + 1, (batch,)).index_fill_(0, torch.tensor([0]), length)

    return make


def token_pair(src: str, tgt: str, length: int = 8) -> Example:
    """Source ids (B, S) in ``cfg.<src>`` and target ids (B, T) in ``cfg.<tgt>``."""

    def make(cfg: Any, batch: int) -> tuple[Tensor, ...]:
        return (
            torch.randint(0, getattr(cfg, src), (batch, length)),  # (B, S)
            torch.randint(0, getattr(cfg, tgt), (batch, length - 2)),  # (B, T)
        )

    return make


def images(cfg: Any, batch: int) -> tuple[Tensor, ...]:
    """Images (B, C, H, W) of the config's shape (16 x 16 for a CNN, which takes any size)."""
    size = getattr(cfg, "image_size", 16)
    return (torch.randn(batch, cfg.in_channels, size, size),)


__all__ = [
    "ModelEntry",
    "add_model",
    "create_model",
    "default_size",
    "family_of",
    "images",
    "list_models",
    "load_pretrained",
    "model_entry",
    "models_table",
    "n_weights",
    "pretrained_names",
    "register_model",
    "token_pair",
    "tokens",
]
