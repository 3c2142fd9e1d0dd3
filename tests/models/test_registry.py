"""Every registered model, on its tiny config: forward + backward, a bf16 autocast step on CPU,
a safetensors round trip with equal outputs, and the verify row that proves it; a model is
covered here by registering it (attnlab.models.registry), with no list to edit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.models import registry
from attnlab.models.bert import Q4Embedding
from attnlab.models.registry import create_model, list_models, model_entry
from attnlab.models.skip_init import skipping_init
from attnlab.train.checkpoint import load_weights, save_weights
from attnlab.verify.registry import CHECKS

NAMES = list_models()


def _tiny(name: str, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """The entry's tiny model (packed tables filled at random too) and an example input."""
    entry = model_entry(name)
    torch.manual_seed(seed)
    cfg = entry.make_config(tiny=True)
    model = entry.build(cfg)
    for module in model.modules():
        if isinstance(module, Q4Embedding):  # zeros until a file is loaded
            module.codes.random_(0, 256)
            module.scales.uniform_(0.01, 0.1)
    torch.manual_seed(seed + 100)
    return model, entry.example(cfg, 3)


def _tensors(out: Any) -> list[Tensor]:
    """The floating tensors of a forward's output (a tensor, tuple or dict)."""
    if isinstance(out, Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []


def _backward(model: nn.Module, out: Any) -> None:
    loss = sum(t.float().square().mean() for t in _tensors(out))
    loss.backward()  # type: ignore[union-attr]
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads), "no parameter got a gradient"
    assert all(g is None or torch.isfinite(g).all() for g in grads)


def test_the_registry_has_every_family() -> None:
    families = {model_entry(n).family for n in NAMES}
    want = {"gpt", "char", "cnn", "seq2seq", "t5", "bert", "albert", "deberta"}
    assert want | {"electra", "vit", "swin", "mae"} <= families
    assert {"gpt", "gpt-mamba", "gpt-rwkv", "gpt-hybrid", "deit", "e5", "minilm"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward(name: str) -> None:
    model, x = _tiny(name)
    out = model.train()(*x)
    assert _tensors(out) and all(torch.isfinite(t).all() for t in _tensors(out))
    _backward(model, out)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_autocast_on_cpu(name: str) -> None:
    model, x = _tiny(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.train()(*x)
    assert all(torch.isfinite(t).all() for t in _tensors(out))
    _backward(model, out)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip(name: str, tmp_path) -> None:
    model, x = _tiny(name, seed=0)
    path = save_weights(model, tmp_path / "model.safetensors")
    other, _ = _tiny(name, seed=1)
    load_weights(other, path)
    with torch.no_grad():
        want, got = _tensors(model.eval()(*x)), _tensors(other.eval()(*x))
    assert len(want) == len(got)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_built_without_initial_values_then_loaded_equals_the_source(name: str, tmp_path) -> None:
    """``load_run`` builds a model under skipping_init and trusts the strict load to fill it:
    a buffer that the constructor draws but the file does not hold would stay garbage."""
    model, x = _tiny(name, seed=0)
    path = save_weights(model, tmp_path / "model.safetensors")
    entry = model_entry(name)
    with skipping_init():
        other = entry.build(entry.make_config(tiny=True))
    load_weights(other, path)
    want, got = dict(model.named_buffers()), dict(other.named_buffers())
    assert want.keys() == got.keys()
    for key in want:  # non-persistent buffers too: those the load does not fill
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    with torch.no_grad():
        outs = _tensors(model.eval()(*x)), _tensors(other.eval()(*x))
    for w, g in zip(*outs, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_verify_row_proves_it(name: str) -> None:
    entry = model_entry(name)
    rows = {check.component for check in CHECKS}
    assert set(entry.oracles) <= rows, f"{name}: no verify row named {entry.oracles}"
    assert entry.oracle is not None or entry.note, f"{name}: no oracle and no note saying why"


@pytest.mark.parametrize("name", NAMES)
def test_default_size_is_counted_without_memory(name: str) -> None:
    assert registry.default_size(name) > 0


def test_e5_is_the_published_architecture() -> None:
    entry = model_entry("e5")
    assert entry.pretrained and entry.family == "bert"
    tiny = entry.make_config(tiny=True)
    assert (tiny.packed_words, tiny.position_offset, tiny.pad_id) == (True, 2, 1)
    # 250037 x 384 packed words + the float encoder of multilingual-e5-small
    assert registry.default_size("e5") == 117_653_760


def test_create_model_overrides_and_refusals() -> None:
    vit = create_model("vit", d_model=32, n_layers=1, n_heads=2, image_size=8)
    assert (vit.cfg.d_model, vit.cfg.distill) == (32, False)
    assert create_model("deit", image_size=8, n_layers=1).cfg.distill
    with pytest.raises(UserError, match="unknown model 'vitt'"):
        create_model("vitt")
    with pytest.raises(UserError, match="no \\['depth'\\]"):
        create_model("vit", depth=3)
    with pytest.raises(UserError, match="no pretrained weights"):
        create_model("bert", pretrained=True)
    assert registry.family_of(vit.cfg) == "vit"
    assert registry.family_of(model_entry("swin").make_config()) == "swin"
    assert list_models("swin") == ["swin"]


def test_register_model_decorates_a_config_class(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))

    @registry.register_model(
        "toy", family="toy", oracle=None, note="a test's", build=lambda c: nn.Linear(c.width, 2),
        example=lambda cfg, b: (torch.randn(b, cfg.width),),
    )  # fmt: skip
    @dataclass
    class ToyConfig:
        width: int = 4

    assert ToyConfig().width == 4  # the class comes back unchanged
    assert create_model("toy", width=3).in_features == 3
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_model("toy", family="x", oracle=None, example=registry.images,
                                build=nn.Identity)(ToyConfig)  # fmt: skip


def test_the_models_command_lists_every_entry(capsys) -> None:
    from attnlab.cli import main

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["name", "family", "parameters"]
    names = {line.split()[0] for line in lines[1:] if line and not line[0].isspace()}
    assert names == set(NAMES)
    assert any(line.startswith("e5 (pretrained)") and "117.7M" in line for line in lines)
