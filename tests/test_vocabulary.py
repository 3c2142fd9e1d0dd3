"""One vocabulary for model configs (docs/extending.md, "One vocabulary for model configs").

* every model config validates through ``configs.validate_config`` (Literal choices, ranges,
  fields filled in from the data) and names one concept one way;
* old names (``norm = "pre"``, ``norm_type``, ``norm_first``, ``max_len``, ``tie_output``) still
  load from a saved config.json, a preset dict, ``apply_overrides`` and the command line, each
  with one deprecation line on stderr, into the same model as the new names;
* positions come from ``positions.make_positions`` in every model; ViT weights saved before it
  (the learned table as a parameter ``pos_embed``) still load.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import torch

from attnlab.blocks import BlockConfig, NormKind, NormPosition
from attnlab.configs import (
    accepted_names,
    add_dataclass_arguments,
    apply_overrides,
    collect_overrides,
    from_dict,
    validate_config,
)
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.classifier import ClassifierConfig, TextClassifier
from attnlab.models.cnn import CNNConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.vit import ViT, ViTConfig
from attnlab.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinCos2DPositionalEncoding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
    make_positions,
    sincos_2d_table,
)

MODEL_CONFIGS = [ClassifierConfig, GPTConfig, Seq2SeqConfig, BertConfig, ViTConfig, CNNConfig]
OLD_NAMES = {"max_len", "norm_first", "tie_output", "norm_type"}
MODELS_DIR = Path(__file__).resolve().parents[1] / "src" / "attnlab" / "models"


def _deprecations(err: str) -> list[str]:
    return [line for line in err.splitlines() if "deprecated" in line]


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


# --------------------------------------------------------------------------- old names


def test_old_classifier_config_loads(capsys: pytest.CaptureFixture[str]) -> None:
    saved = {"vocab_size": 30, "norm": "post", "norm_type": "rms", "max_len": 99, "pos": "rope"}
    cfg = from_dict(ClassifierConfig, saved)
    want = ClassifierConfig(vocab_size=30, norm_position="post", norm="rms", context=99, pos="rope")
    assert cfg == want
    lines = _deprecations(capsys.readouterr().err)
    assert len(lines) == 3
    assert any("norm is now norm_position" in line for line in lines)
    assert any("norm_type is now norm" in line for line in lines)
    # today's spelling: nothing printed, and `norm` is the norm type
    assert from_dict(ClassifierConfig, {"norm": "rms"}).norm == "rms"
    assert capsys.readouterr().err == ""


def test_old_seq2seq_config_loads(capsys: pytest.CaptureFixture[str]) -> None:
    base = {"src_vocab_size": 20, "tgt_vocab_size": 20, "d_model": 16, "n_heads": 2}
    for old_value, position in ((True, "pre"), ("false", "post"), ("1", "pre")):
        saved = {**base, "norm_first": old_value, "max_len": 64, "tie_output": False}
        cfg = from_dict(Seq2SeqConfig, saved)
        assert (cfg.norm_position, cfg.context, cfg.tie_weights) == (position, 64, False)
        assert len(_deprecations(capsys.readouterr().err)) == 3
    old = Seq2SeqTransformer(from_dict(Seq2SeqConfig, {**base, "norm_first": True}))
    new = Seq2SeqTransformer(Seq2SeqConfig(**base, norm_position="pre"))
    assert old.state_dict().keys() == new.state_dict().keys()
    assert (
        old.encoder.blocks[0].cfg.norm_position == new.encoder.blocks[0].cfg.norm_position == "pre"
    )


def test_old_bert_config_loads(capsys: pytest.CaptureFixture[str]) -> None:
    small = {"vocab_size": 40, "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
    cfg = from_dict(BertConfig, {**small, "max_len": 24})
    assert cfg.context == 24
    assert len(_deprecations(capsys.readouterr().err)) == 1
    assert BertModel(cfg).embeddings.position.context == 24


def test_gpt_vit_cnn_configs_of_today_load_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    for cls in (GPTConfig, ViTConfig, CNNConfig):
        assert from_dict(cls, dataclasses.asdict(cls())) == cls()
    assert capsys.readouterr().err == ""


def test_old_and_new_name_together_is_refused() -> None:
    with pytest.raises(ValueError, match="'max_len' and 'context' both set context"):
        from_dict(Seq2SeqConfig, {"max_len": 10, "context": 12})
    with pytest.raises(ValueError, match="both set norm"):
        apply_overrides(ClassifierConfig(), {"norm": "rms", "norm_type": "layer"})


def test_apply_overrides_reads_old_names(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = apply_overrides(ClassifierConfig(), {"norm": "post", "max-len": "300"})
    assert (cfg.norm_position, cfg.context, cfg.norm) == ("post", 300, "layer")
    assert len(_deprecations(capsys.readouterr().err)) == 2
    with pytest.raises(ValueError, match="norm must be one of|not one of the choices"):
        apply_overrides(ClassifierConfig(), {"norm": "middle"})


def test_command_line_reads_old_names_and_hides_them(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Seq2SeqConfig)
    args = parser.parse_args(["--norm-first", "--max_len", "300", "--tie-output", "false"])
    overrides = collect_overrides(args, Seq2SeqConfig)
    cfg = apply_overrides(Seq2SeqConfig(), overrides)
    assert (cfg.norm_position, cfg.context, cfg.tie_weights) == ("pre", 300, False)
    assert len(_deprecations(capsys.readouterr().err)) == 3
    shown = parser.format_help()
    assert "--norm-position" in shown and "--norm-first" not in shown and "--max-len" not in shown
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, ClassifierConfig)  # `norm` is a field and an old value
    cfg = apply_overrides(
        ClassifierConfig(),
        collect_overrides(parser.parse_args(["--norm", "post"]), ClassifierConfig),
    )
    assert cfg.norm_position == "post"


def test_accepted_names_lists_fields_then_old_names() -> None:
    names = accepted_names(Seq2SeqConfig)
    assert names[-3:] == ["norm_first", "max_len", "tie_output"]
    assert accepted_names(ClassifierConfig).count("norm") == 1


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


def test_vit_weights_saved_with_the_old_position_parameter_load() -> None:
    cfg = ViTConfig(image_size=8, patch_size=4, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    model = ViT(cfg).eval()
    old = dict(model.state_dict())
    old["pos_embed"] = old.pop("pos_embed.embedding.weight")[None]  # (1, T, D), as saved before
    fresh = ViT(cfg).eval()
    fresh.load_state_dict(old)
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_classifier_old_preset_builds_the_same_network() -> None:
    old = from_dict(ClassifierConfig, {"vocab_size": 20, "norm": "post", "norm_type": "rms"})
    a = TextClassifier(old)
    b = TextClassifier(ClassifierConfig(vocab_size=20, norm_position="post", norm="rms"))
    assert a.encoder.norm is None and b.encoder.norm is None  # post-norm: no final norm
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        k: v.shape for k, v in b.state_dict().items()
    }


def test_presets_and_command_line_mix_old_and_new_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each source is translated on its own, so a later source wins whichever name it uses
    (the bundled classify preset says norm_position; an old command line says norm=post)."""
    from attnlab.tasks import classify, sections, translate

    preset = sections.PRESETS / "classify.toml"
    model = sections.build_sections(classify.SECTIONS, [preset], {"norm": "post"})["model"]
    assert (model.norm_position, model.norm) == ("post", "layer")
    old = tmp_path / "old.toml"
    old.write_text("[model]\nnorm_first = true\nmax_len = 300\ntie_output = false\n")
    model = sections.build_sections(translate.SECTIONS, [old], {"context": "200"})["model"]
    assert (model.norm_position, model.context, model.tie_weights) == ("pre", 200, False)
    assert len(_deprecations(capsys.readouterr().err)) == 4


def test_resuming_with_an_old_name_compares_it_as_the_new_one() -> None:
    from attnlab.configs import to_dict
    from attnlab.tasks import runner
    from attnlab.tasks.registry import get_task

    task = get_task("translate")
    cfg = runner.build_config(task, None, {})
    raw = {name: to_dict(section) for name, section in cfg.sections.items()}
    context = cfg.sections["model"].context
    same = runner.resumed_config(task, raw, {"max_len": str(context)}, None)  # no change
    assert same.sections["model"].context == context
    with pytest.raises(ValueError, match="--context cannot change when resuming"):
        runner.resumed_config(task, raw, {"max_len": str(context + 1)}, None)


def test_ablation_recognises_the_preset_under_an_old_name() -> None:
    from attnlab.tasks.ablate import variants

    base = {"norm_position": "pre", "norm": "layer", "n_heads": 4}
    plan = variants({"norm": ["pre", "post"], "n_heads": ["4", "8"]}, base, grid=False)
    assert [name for name, *_ in plan] == ["preset", "norm=post", "n_heads=8"]
