"""One vocabulary for model configs (docs/extending.md, "One vocabulary for model configs").

* every model config validates through ``configs.validate_config`` (Literal choices, ranges,
  fields filled in from the data) and names one concept one way;
* a name no config has (``max_len`` for ``context``, ``norm_first`` for ``norm_position``) is
  refused in one line naming the closest field, from a saved config.json, a preset,
  ``apply_overrides`` and the command line alike;
* positions come from ``positions.make_positions`` in every model.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import torch

from attnlab.configs import (
    add_dataclass_arguments,
    apply_overrides,
    collect_overrides,
    from_dict,
    validate_config,
)
from attnlab.layers.blocks import BlockConfig, NormKind, NormPosition
from attnlab.layers.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinCos2DPositionalEncoding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
    make_positions,
    sincos_2d_table,
)
from attnlab.models.bert import BertConfig
from attnlab.models.classifier import ClassifierConfig
from attnlab.models.cnn import CNNConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig

MODEL_CONFIGS = [ClassifierConfig, GPTConfig, Seq2SeqConfig, BertConfig, ViTConfig, CNNConfig]
OLD_NAMES = {"max_len", "norm_first", "tie_output", "norm_type"}
MODELS_DIR = Path(__file__).resolve().parents[1] / "src" / "attnlab" / "models"


# --------------------------------------------------------------------------- the vocabulary


@pytest.mark.parametrize("cls", MODEL_CONFIGS + [BlockConfig])
def test_fields_use_the_one_vocabulary(cls: type) -> None:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    assert not names & OLD_NAMES, f"{cls.__name__} still has {names & OLD_NAMES}"
    for f in dataclasses.fields(cls):
        assert hints[f.name] is not str, f"{cls.__name__}.{f.name}: a choice must be a Literal"
    if "norm" in names:
        assert hints["norm"] == NormKind
    if "norm_position" in names:
        assert hints["norm_position"] == NormPosition


@pytest.mark.parametrize("cls", MODEL_CONFIGS)
def test_every_literal_and_range_is_checked_on_construction(cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if typing.get_origin(hints[f.name]) is typing.Literal:
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{f.name} must be one of"):
                cls(**{f.name: "no-such-choice"})
        if "min" in f.metadata:
            bad = f.metadata["min"] - 1
            if f.metadata.get("unset") == bad:
                bad -= 1
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{f.name} must be >="):
                cls(**{f.name: bad})


def test_validation_is_one_mechanism_with_cross_field_rules_on_top() -> None:
    cfg = GPTConfig()  # vocab_size 0: not filled in yet, which construction allows
    with pytest.raises(ValueError, match="GPTConfig.vocab_size must be set .*tokenizer"):
        cfg.validate(complete=True)
    cfg.vocab_size = 10
    cfg.validate(complete=True)
    cfg.dropout = 1.0  # edited after construction: the model's own check still refuses it
    with pytest.raises(ValueError, match=r"GPTConfig.dropout must be < 1.0, got 1.0"):
        validate_config(cfg)
    with pytest.raises(ValueError, match="linear attention does not form"):
        GPTConfig(attention="linear", pos="alibi")
    with pytest.raises(ValueError, match="not divisible by n_heads=5"):
        ClassifierConfig(d_model=32, n_heads=5)
    with pytest.raises(ValueError, match="needs window >= 1"):
        Seq2SeqConfig(attention="local")


# --------------------------------------------------------------------------- unknown names


@pytest.mark.parametrize("cls", [ClassifierConfig, Seq2SeqConfig, BertConfig])
def test_a_name_no_config_has_is_refused_naming_the_closest(cls: type) -> None:
    with pytest.raises(ValueError, match="unknown field 'max_len'.*Valid fields"):
        from_dict(cls, {"max_len": 99})
    with pytest.raises(ValueError, match="unknown field 'norm_first'"):
        apply_overrides(cls(), {"norm-first": "true"})


def test_dashes_and_underscores_name_one_field() -> None:
    cfg = apply_overrides(ClassifierConfig(), {"norm-position": "post", "n_heads": "8"})
    assert (cfg.norm_position, cfg.n_heads) == ("post", 8)
    with pytest.raises(ValueError, match="n_heads is given twice"):
        apply_overrides(ClassifierConfig(), {"n-heads": "2", "n_heads": "4"})


def test_configs_of_today_load_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    for cls in MODEL_CONFIGS:
        assert from_dict(cls, dataclasses.asdict(cls())) == cls()
    assert capsys.readouterr().err == ""


def test_command_line_has_one_option_per_field() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Seq2SeqConfig)
    args = parser.parse_args(["--norm-position", "pre", "--context", "300"])
    cfg = apply_overrides(Seq2SeqConfig(), collect_overrides(args, Seq2SeqConfig))
    assert (cfg.norm_position, cfg.context) == ("pre", 300)
    with pytest.raises(SystemExit):
        parser.parse_args(["--norm-first"])


# --------------------------------------------------------------------------- positions


def test_position_factory_gives_each_kind_its_modules() -> None:
    D, H, T = 16, 4, 10
    kinds = {
        "sinusoidal": ("absolute", SinusoidalPositionalEncoding),
        "learned": ("absolute", LearnedPositionalEmbedding),
        "rope": ("rotary", RotaryEmbedding),
        "t5": ("bias", T5RelativePositionBias),
        "alibi": ("bias", ALiBi),
    }
    for kind, (slot, module) in kinds.items():
        p = make_positions(kind, D, H, T)
        assert isinstance(getattr(p, slot), module), kind
        assert [s for s in ("absolute", "rotary", "bias") if getattr(p, s) is not None] == [slot]
    none = make_positions("none", D, H, T)
    assert none.absolute is none.rotary is none.bias is None
    assert make_positions("t5", D, H, T, causal=True).bias.bidirectional is False
    assert make_positions("learned", D, H, T).absolute.context == T
    with pytest.raises(ValueError, match="pos must be one of"):
        make_positions("spiral", D, H, T)  # type: ignore[arg-type]


def test_sincos2d_positions_leave_the_prefix_token_unplaced() -> None:
    enc = make_positions("sincos2d", 8, 2, 5, grid=2, n_prefix=1).absolute
    assert isinstance(enc, SinCos2DPositionalEncoding)
    x = torch.randn(3, 5, 8)
    out = enc(x)
    torch.testing.assert_close(out[:, 0], x[:, 0])
    torch.testing.assert_close(out[:, 1:] - x[:, 1:], sincos_2d_table(2, 8).expand(3, -1, -1))


def test_models_build_positions_only_through_the_factory() -> None:
    classes = r"\b(SinusoidalPositionalEncoding|LearnedPositionalEmbedding|RotaryEmbedding|ALiBi"
    classes += r"|T5RelativePositionBias|SinCos2DPositionalEncoding)\("
    for path in MODELS_DIR.glob("*.py"):
        assert not re.search(classes, path.read_text()), f"{path.name} builds positions itself"
