"""Config plumbing shared by every task: dataclass <-> JSON/TOML, typed overrides, argparse.

Model configs share one mechanism (:class:`ConfigBase`): ``Literal`` choices and the numeric
ranges declared with :func:`setting` are checked by :func:`validate_config` on construction, each
config adding only its cross-field rules in ``check``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from attnlab.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

T = TypeVar("T")

SETTING = "attnlab.setting"  # metadata key: the field was declared with setting()

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
_NONE = {"none", "null"}


def _check_dataclass(obj_or_cls: Any) -> type:
    """Return the dataclass type of `obj_or_cls`, or raise a ValueError saying it is not one."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    if not dataclasses.is_dataclass(cls):
        raise UserError(f"{cls.__name__} is not a dataclass; decorate it with @dataclass")
    return cls


def setting(
    default: Any,
    help: str = "",
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    unset: Any = dataclasses.MISSING,
    set_by: str = "",
) -> Any:
    """A config field with its --help text and the range :func:`validate_config` enforces.

    The one way to declare a field of a config that presets or the command line set.
    ``min``/``max`` are inclusive bounds, ``above``/``below`` exclusive ones. ``unset`` marks a
    value meaning "not filled in yet" (e.g. ``vocab_size = 0`` until the tokenizer exists): it
    passes on construction and is refused by ``validate(complete=True)``, naming ``set_by``.
    """
    meta: dict[str, Any] = {SETTING: True, "help": help} if help else {SETTING: True}
    for key, bound in (("min", min), ("max", max), ("above", above), ("below", below)):
        if bound is not None:
            meta[key] = bound
    if unset is not dataclasses.MISSING:
        meta["unset"], meta["set_by"] = unset, set_by
    return dataclasses.field(default=default, metadata=meta)


def _underscored(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with dashes in its keys read as underscores (``n-heads`` is ``n_heads``); one
    field given in both spellings is refused, since nothing says which one wins."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in out:
            raise UserError(f"{name} is given twice (as {name} and as {key}); keep one")
        out[name] = value
    return out


def _choices_text(args: tuple[Any, ...]) -> str:
    return ", ".join(map(str, args))


def validate_config(cfg: Any, complete: bool = False) -> None:
    """Check every ``Literal`` field's value and every range declared with :func:`setting`.

    With ``complete`` also refuse fields still at their ``unset`` value. Raises a ValueError
    of one line naming the config, the field, what it got and what is allowed.
    """
    cls = _check_dataclass(cfg)
    ftypes = _field_types(cls)
    for f in dataclasses.fields(cls):
        value, tp, meta = getattr(cfg, f.name), ftypes[f.name], f.metadata
        where = f"{cls.__name__}.{f.name}"
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args:
            if value is None:
                continue
            args = typing.get_args(next(a for a in args if a is not type(None)))
            tp = Literal[args] if args else tp
        if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
            raise UserError(
                f"{where} must be one of {_choices_text(typing.get_args(tp))}, got {value!r}"
            )
        if "unset" in meta and value == meta["unset"]:
            if complete:
                raise UserError(
                    f"{where} must be set before building the model (it comes from "
                    f"{meta['set_by'] or 'the data'})"
                )
            continue
        _check_range(where, value, meta)


def _check_range(where: str, value: Any, meta: Mapping[str, Any]) -> None:
    """Refuse ``value`` outside a bound in ``meta``, naming the bound it breaks."""
    for key, rule, ok in (
        ("min", ">=", lambda bound: value >= bound),
        ("above", ">", lambda bound: value > bound),
        ("max", "<=", lambda bound: value <= bound),
        ("below", "<", lambda bound: value < bound),
    ):
        if key in meta and not ok(meta[key]):
            raise UserError(f"{where} must be {rule} {meta[key]}, got {value}")


class ConfigBase:
    """Base of every config a preset or the command line sets: validated on construction by
    one mechanism.

    Subclasses are dataclasses; they declare fields with :func:`setting`, choices as ``Literal``
    types, and only their cross-field rules in ``check``. Models call
    ``cfg.validate(complete=True)`` again before building (a config may be edited after it
    was made, and fields such as ``vocab_size`` are filled in from the data).
    """

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, complete: bool = False) -> None:
        """Raise ValueError naming the field and what to change."""
        validate_config(self, complete)
        self.check()

    def check(self) -> None:
        """Cross-field rules of this config (none by default)."""


def project(source: Any, cls: type[T], **changes: Any) -> T:
    """A ``cls`` made of the fields of ``source`` that ``cls`` has by the same name, then
    ``changes`` (e.g. a model config's block settings as a ``blocks.BlockConfig``)."""
    names = {f.name for f in dataclasses.fields(_check_dataclass(cls))}
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(source)}
    return cls(**{k: v for k, v in values.items() if k in names} | changes)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """Map each dataclass field name to its resolved type annotation (resolving the string
    annotations costs milliseconds a class; a config is validated on every construction)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unknown_field_error(cls: type, name: str) -> UserError:
    """Build the error for a field name that `cls` does not have, suggesting the closest one."""
    valid = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return UserError(
        f"unknown field '{name}' for {cls.__name__}.{hint} Valid fields: {', '.join(valid)}"
    )


def _type_name(tp: Any) -> str:
    """Human-readable name of a type annotation, for error messages."""
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _split_seq(value: str) -> list[str]:
    """Split "0.9,0.98", "(0.9, 0.98)" or "[1,2]" into its stripped items."""
    inner = value.strip().strip("()[]").strip()
    return [] if not inner else [item.strip() for item in inner.split(",")]


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert `value` (often a string from the command line) to annotation `tp` or raise."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = UserError(f"field '{name}': cannot parse {value!r} as {_type_name(tp)}")
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if type(None) in args and (value is None or str(value).strip().lower() in _NONE):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, name)
            except ValueError:
                continue
        raise bad
    if origin is Literal:
        for choice in args:
            try:
                if _coerce(value, type(choice), name) == choice:
                    return choice
            except ValueError:
                continue
        raise UserError(
            f"field '{name}': {value!r} is not one of the choices {', '.join(map(repr, args))}"
        )
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise UserError(f"field '{name}': cannot parse {value!r} as bool (use true/false)")
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                try:
                    as_float = float(value)  # accept "1e3" for integer fields
                except ValueError:
                    raise bad from None
                if as_float.is_integer():
                    return int(as_float)
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if tp is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise bad
    if origin in (tuple, list):
        items = _split_seq(value) if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise bad
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(items) != len(args):
                raise UserError(
                    f"field '{name}': expected {len(args)} comma-separated values "
                    f"({_type_name(tp)}), got {value!r}"
                )
            return tuple(_coerce(v, a, name) for v, a in zip(items, args))
        elem = args[0] if args else Any
        out = [_coerce(v, elem, name) for v in items]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return dict(value)
        raise bad
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return from_dict(tp, value)
        raise bad
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise UserError(f"field '{name}': unsupported field type {_type_name(tp)}")


def coerce_value(value: Any, tp: Any, name: str) -> Any:
    """Convert ``value`` (often command-line text) to type ``tp``; ValueError naming ``name``."""
    return _coerce(value, tp, name)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Return dataclass `cfg` as a dict (tuples stay tuples, nested dataclasses become dicts)."""
    _check_dataclass(cfg)
    return dataclasses.asdict(cfg)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build dataclass `cls` from a dict, coercing values to field types; unknown keys raise."""
    _check_dataclass(cls)
    ftypes = _field_types(cls)
    kwargs = {}
    for name, value in _underscored(data).items():
        if name not in ftypes:
            raise _unknown_field_error(cls, name)
        kwargs[name] = _coerce(value, ftypes[name], name)
    return cls(**kwargs)


def save_json(cfg: Any, path: str | Path) -> Path:
    """Write the dataclass `cfg` to `path` as indented JSON and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dict(cfg), indent=2, default=str) + "\n")
    return path


def load_json(cls: type[T], path: str | Path) -> T:
    """Read a JSON file written by `save_json` back into dataclass `cls` (tuples restored)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read this config JSON file ({err}); restore it") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object of config fields, got {type(data)}")
    return from_dict(cls, data)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file into a plain dict (pass it to `apply_overrides` or `from_dict`)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UserError(f"{path}: not a readable TOML config ({err}); fix that line") from None


def apply_overrides(cfg: T, overrides: dict[str, Any]) -> T:
    """Return a copy of `cfg` with `overrides` applied; strings are coerced to each field's type.

    Keys may use dashes or underscores; a dotted key ("train.lr") reaches into a nested dataclass.
    """
    cls = _check_dataclass(cfg)
    ftypes = _field_types(cls)
    changes: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for name, value in _underscored(overrides).items():
        head, dot, rest = name.partition(".")
        if head not in ftypes:
            raise _unknown_field_error(cls, head)
        if dot:
            if not dataclasses.is_dataclass(ftypes[head]):
                raise UserError(f"field '{head}' is not a nested config; cannot set '{name}'")
            nested.setdefault(head, {})[rest] = value
        else:
            changes[name] = _coerce(value, ftypes[name], name)
    for head, sub in nested.items():
        changes[head] = apply_overrides(changes.get(head, getattr(cfg, head)), sub)
    return dataclasses.replace(cfg, **changes)


def _metavar(tp: Any) -> str:
    """Short metavar for an argparse option of type `tp`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "{" + ",".join(map(str, args)) + "}"
    if origin in (tuple, list):
        return "A,B,..."
    return _type_name(tp).upper()


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    defaults: Any = None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Add a `--field-name VALUE` option (also `--field_name`) for every field of dataclass `cls`.

    Options default to "not given", so `collect_overrides` returns only what the user typed.
    Bool fields also accept a bare flag (`--tensorboard` means true). Help text comes from
    :func:`setting` when present; the default it shows is the field's value in
    ``defaults`` (an instance of ``cls``, e.g. built from a preset) or else the dataclass
    default. Fields named in ``skip`` are left out.
    """
    _check_dataclass(cls)
    ftypes = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        help_text = f"{f.metadata.get('help', '')} (default: {default})".strip()
        flags = [f"--{f.name.replace('_', '-')}"]
        if "_" in f.name:
            flags.append(f"--{f.name}")
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if ftypes[f.name] is bool else {}
        parser.add_argument(
            *flags,
            dest=f.name,
            default=argparse.SUPPRESS,
            metavar=_metavar(ftypes[f.name]),
            help=help_text.replace("%", "%%"),  # argparse %-formats help strings
            **extra,
        )


def collect_overrides(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Return {field: raw value} for the fields of `cls` that were given on the command line."""
    given = vars(namespace)
    return {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}


def parse_key_values(items: list[str]) -> dict[str, str]:
    """Parse positional overrides like ["n_heads=4", "lr=3e-4"] into {"n_heads": "4", ...}."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not of the form key=value (e.g. n_heads=4)")
        key, value = key.strip().replace("-", "_"), value.strip()
        if out.get(key, value) != value:
            raise UserError(f"{key} is given twice ({key}={out[key]} and {key}={value}); keep one")
        out[key] = value
    return out


def refuse_conflicts(fields: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
    """Refuse a field set both as FIELD=VALUE and by its --flag to another value (one of the
    two would be dropped without a word)."""
    for key, value in flags.items():
        if key in fields and str(fields[key]) != str(value):
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{key} is given twice, as {flag} {value} and as {key}={fields[key]}; keep one"
            )
