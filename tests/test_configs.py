"""Config plumbing: JSON/TOML round-trips, typed overrides, argparse options, error messages."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from attnlab.configs import (
    add_dataclass_arguments,
    apply_overrides,
    collect_overrides,
    from_dict,
    load_json,
    load_toml,
    parse_key_values,
    save_json,
    to_dict,
)
from attnlab.train import TrainConfig


@dataclass
class Inner:
    dim: int = 8
    act: Literal["relu", "gelu"] = "relu"


@dataclass
class Cfg:
    n_layers: int = 2
    lr: float = 1e-3
    name: str = "x"
    use_bias: bool = True
    betas: tuple[float, float] = (0.9, 0.98)
    sizes: tuple[int, ...] = (1, 2)
    max_len: int | None = None
    out: Path = Path("runs")
    mode: Literal["a", "b"] = "a"
    inner: Inner = field(default_factory=Inner)


def test_json_round_trip_keeps_tuples_and_nested(tmp_path: Path) -> None:
    cfg = Cfg(n_layers=3, betas=(0.8, 0.9), sizes=(4, 5, 6), max_len=7, inner=Inner(dim=4))
    loaded = load_json(Cfg, save_json(cfg, tmp_path / "cfg.json"))
    assert loaded == cfg
    assert isinstance(loaded.betas, tuple) and isinstance(loaded.out, Path)
    assert isinstance(loaded.inner, Inner)


def test_train_config_round_trip(tmp_path: Path) -> None:
    cfg = TrainConfig(lr=3e-4, betas=(0.85, 0.95), schedule="noam", warmup_steps=10)
    assert load_json(TrainConfig, save_json(cfg, tmp_path / "t.json")) == cfg
    assert to_dict(cfg)["betas"] == (0.85, 0.95)


def test_load_toml_then_apply(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("n_layers = 4\nlr = 0.01\nbetas = [0.7, 0.8]\n[inner]\ndim = 32\n")
    data = load_toml(path)
    assert data == {"n_layers": 4, "lr": 0.01, "betas": [0.7, 0.8], "inner": {"dim": 32}}
    cfg = from_dict(Cfg, data)
    assert cfg.betas == (0.7, 0.8) and cfg.inner == Inner(dim=32) and cfg.n_layers == 4


@pytest.mark.parametrize(
    "name,content,problem",
    [
        ("c.toml", "n_layers = 4\nlr = \n", "not a readable TOML config (Invalid value (at line 2"),
        ("absent.toml", None, "not a readable TOML config ([Errno 2]"),
        ("c.json", '{"n_layers": 4,', "cannot read this config JSON file (Expecting"),
        ("absent.json", None, "cannot read this config JSON file ([Errno 2]"),
    ],
)
def test_broken_config_files_are_one_line_errors_naming_the_file(
    tmp_path: Path, name: str, content: str | None, problem: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as err:
        load_toml(path) if name.endswith(".toml") else load_json(Cfg, path)
    message = str(err.value)
    assert message.startswith(f"{path}: {problem}") and "\n" not in message


def test_overrides_coerce_strings_to_field_types() -> None:
    cfg = apply_overrides(
        Cfg(),
        {
            "n-layers": "6",
            "lr": "3e-4",
            "use_bias": "no",
            "betas": "0.9,0.95",
            "sizes": "(3, 4, 5)",
            "max_len": "128",
            "out": "elsewhere",
            "mode": "b",
            "inner.act": "gelu",
        },
    )
    assert cfg.n_layers == 6 and cfg.lr == 3e-4 and cfg.use_bias is False
    assert cfg.betas == (0.9, 0.95) and cfg.sizes == (3, 4, 5)
    assert cfg.max_len == 128 and cfg.out == Path("elsewhere") and cfg.mode == "b"
    assert cfg.inner.act == "gelu" and cfg.inner.dim == 8
    assert apply_overrides(cfg, {"max_len": "none"}).max_len is None
    assert Cfg().n_layers == 2, "apply_overrides must not mutate its input"


@pytest.mark.parametrize(
    "text,expected",
    [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False), ("no", False)],
)
def test_bool_spellings(text: str, expected: bool) -> None:
    assert apply_overrides(Cfg(), {"use_bias": text}).use_bias is expected


def test_unknown_field_lists_valid_names_and_suggests() -> None:
    with pytest.raises(ValueError) as err:
        apply_overrides(Cfg(), {"n_layer": "3"})
    message = str(err.value)
    assert "n_layer" in message and "Did you mean 'n_layers'" in message
    assert "lr" in message and "use_bias" in message  # the valid names are listed


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("n_layers", "two", "n_layers"),
        ("lr", "fast", "lr"),
        ("use_bias", "maybe", "use_bias"),
        ("betas", "0.9", "expected 2"),
        ("mode", "c", "'a', 'b'"),
        ("n_layers", "2.5", "int"),
    ],
)
def test_unparsable_values_name_field_and_type(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=key):
        apply_overrides(Cfg(), {key: value})
    with pytest.raises(ValueError) as err:
        apply_overrides(Cfg(), {key: value})
    assert fragment in str(err.value)


def test_train_config_validation_through_overrides() -> None:
    assert apply_overrides(TrainConfig(), {"schedule": "linear"}).schedule == "linear"
    with pytest.raises(ValueError, match="cosine"):
        apply_overrides(TrainConfig(), {"schedule": "step"})
    with pytest.raises(ValueError, match="grad_accum"):
        apply_overrides(TrainConfig(), {"grad_accum": "0"})
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(schedule="noam")
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")  # type: ignore[arg-type]


def test_argparse_options_only_collect_given_fields() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainConfig)
    ns = parser.parse_args(
        ["--lr", "3e-4", "--grad_accum", "4", "--betas", "0.9,0.95", "--tensorboard"]
    )
    overrides = collect_overrides(ns, TrainConfig)
    assert overrides == {
        "lr": "3e-4",
        "grad_accum": "4",
        "betas": "0.9,0.95",
        "tensorboard": "true",
    }
    cfg = apply_overrides(TrainConfig(tensorboard=False), overrides)
    assert cfg.lr == 3e-4 and cfg.grad_accum == 4 and cfg.betas == (0.9, 0.95) and cfg.tensorboard
    assert "--max-steps" in parser.format_help() and "optimizer steps" in parser.format_help()


def test_parse_key_values() -> None:
    assert parse_key_values(["n_heads=4", "lr = 3e-4", "name=a=b", "n-layers=2"]) == {
        "n_heads": "4",
        "lr": "3e-4",
        "name": "a=b",
        "n_layers": "2",
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_key_values(["n_heads"])
    with pytest.raises(ValueError, match="key=value"):
        parse_key_values(["=4"])


def test_non_dataclass_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a dataclass"):
        apply_overrides({"lr": 1}, {"lr": "2"})


@dataclass
class Percent:
    holdout: float = field(default=0.1, metadata={"help": "this % of train texts"})
    tag: str = "50%"
    sizes: tuple[int, ...] = field(default_factory=lambda: (1, 2))


def test_help_survives_percent_signs_and_shows_factory_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Percent)
    text = parser.format_help()
    assert "this % of train texts" in text and "(default: 50%)" in text
    assert "(default: (1, 2))" in text


def test_every_section_of_every_task_is_a_config_base_declared_with_setting() -> None:
    """One way to declare a setting: each section a preset or the command line can set is a
    ``ConfigBase``, and a field with help or a range has it from ``configs.setting`` (a bare
    default is ``setting(default)`` without them); ``field(metadata=...)`` or another helper
    fails here."""
    import dataclasses

    from attnlab.configs import SETTING, ConfigBase
    from attnlab.runs.registry import get_task, task_names

    checked = 0
    for name in task_names():
        task = get_task(name)
        for arch in task.archs or ("",):
            parts = [*task.arch_sections(arch).items(), *task.derived_sections(arch).items()]
            for section, cls in parts:
                assert issubclass(cls, ConfigBase), f"{name}.{section}: {cls.__name__}"
                for f in dataclasses.fields(cls):
                    declared = f.metadata.get(SETTING) or not f.metadata
                    assert declared, f"{cls.__name__}.{f.name}: declare it with setting()"
                    checked += 1
    assert checked > 150
