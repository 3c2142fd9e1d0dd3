"""Swin and DeiT through the CLI on a tiny image folder: train, eval, predict, attention and
explore; DeiT distils from a finished CNN run and refuses a missing or mismatched teacher."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import torch
from tests.tasks.test_vision import _image_folder

from attnlab.cli import main
from attnlab.data.images import normalize
from attnlab.explore import pack
from attnlab.explore.page import read_page_data
from attnlab.explore.sources import load_source

COMMON = [
    "--dataset", "folder", "--channels", "1", "--val-ratio", "0.25", "--test-ratio", "0.25",
    "--max-steps", "40", "--batch-size", "8", "--eval-every", "40", "--lr", "1e-2",
    "--tensorboard", "false", "--max-minutes", "0", "--precision", "fp32",
]  # fmt: skip


def _train(task: str, out: Path, root: Path, *extra: str) -> dict:
    """``task``: a task and its options, "vision --arch swin"."""
    args = ["train", *task.split(), "--out", str(out), "--data", str(root), *COMMON, *extra]
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


def test_swin_end_to_end_with_windows_on_the_explorer(tmp_path: Path, capsys) -> None:
    root = _image_folder(tmp_path / "imgs")
    run = tmp_path / "swin"
    swin = ["--patch-size", "1", "--d-model", "8", "--depths", "2,1", "--stage-heads", "2,4"]
    results = _train("vision --arch swin", run, root, *swin, "--window", "4")
    assert results["test"]["accuracy"] == 1.0  # top vs bottom is trivially separable
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0
    top = str(root / "top" / "0.png")
    assert main(["predict", str(run), top]) == 0
    assert capsys.readouterr().out.startswith("top")
    assert main(["attention", str(run), top, "--out", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").stat().st_size > 1000

    page = tmp_path / "p.html"
    assert main(["explore", str(run), top, "--out", str(page)]) == 0
    (ex,) = read_page_data(page.read_text(encoding="utf-8"))["examples"]
    names = [g["name"] for g in ex["groups"]]
    assert names[0].startswith("stage 1 block 1: 4×4 windows, not shifted")
    assert names[1].startswith("stage 1 block 2: 4×4 windows, shifted by 2")
    # the masks are the windows: 16 keys per query, the shifted ones differ
    masks = [
        np.frombuffer(base64.b64decode(g["mask"]), np.uint8).reshape(144, 144)
        for g in ex["groups"][:2]
    ]
    assert (masks[0].sum(1) == 16).all() and not np.array_equal(masks[0], masks[1])
    assert (masks[1].sum(1) <= 16).all() and (masks[1].sum(1) < 16).any()  # cut by the shift
    source = load_source(run).run
    x = normalize(source.load_images([top]), source.report["mean"], source.report["std"])
    info = source.model.inspect(x)
    w = pack.decode_f32(ex["groups"][0]["weights"], (1, 2, 144, 144))
    # row 0 (token 0,0) sees its window: slots of window 0 in row-major order
    want = info["attention"][0][0, 0, :, 0].numpy()  # (H, 16)
    cols = [r * 12 + c for r in range(4) for c in range(4)]
    assert np.abs(w[0][:, 0][:, cols] - want).max() < 1e-6
    assert abs(w[0, :, 0].sum(-1) - 1).max() < 1e-5


def test_deit_distils_from_a_cnn_run(tmp_path: Path, capsys) -> None:
    root = _image_folder(tmp_path / "imgs")
    teacher = tmp_path / "cnn"
    cnn = ["--channel-attention", "se", "--width", "8", "--stages", "2"]
    _train("vision --arch cnn", teacher, root, *cnn)
    vit = ["--patch-size", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2"]
    vit += ["--d-ff", "32"]
    run = tmp_path / "deit"
    capsys.readouterr()
    deit = ["train", "vision", "--arch", "deit", "--out", str(run), "--data", str(root)]
    assert main([*deit, *COMMON, *vit]) == 2
    assert "--arch deit needs --teacher RUN" in capsys.readouterr().err
    assert main([*deit, *COMMON, *vit, "--teacher", str(teacher), "--distill", "false"]) == 2
    assert "--arch deit trains a ViT with distill = true" in capsys.readouterr().err
    assert not run.exists()
    results = _train("vision --arch deit", run, root, *vit, "--teacher", str(teacher))
    assert results["test"]["accuracy"] == 1.0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("teacher_agree" in json.dumps(m) for m in metrics)
    source = load_source(run).run
    assert source.model.dist_token is not None and source.model.cfg.distill
    top = str(root / "top" / "0.png")
    page = tmp_path / "p.html"
    assert main(["explore", str(run), top, "--out", str(page)]) == 0
    (ex,) = read_page_data(page.read_text(encoding="utf-8"))["examples"]
    assert ex["groups"][0]["query_tokens"][:3] == ["[cls]", "[dist]", "p0,0"]
    assert main(["attention", str(run), top, "--out", str(tmp_path / "a.png")]) == 0
    # --teacher with another architecture is refused before anything is written
    bad = tmp_path / "vit"
    args = ["train", "vision", "--out", str(bad), "--data", str(root), *COMMON, *vit]
    assert main([*args, "--teacher", str(teacher)]) == 2
    assert not bad.exists()
    torch.manual_seed(0)


def test_a_vit_with_the_distillation_token_is_refused(tmp_path: Path, capsys) -> None:
    root = _image_folder(tmp_path / "imgs")
    out = tmp_path / "vit"
    args = ["train", "vision", "--out", str(out), "--data", str(root), *COMMON, "--patch-size", "4"]
    assert main([*args, "--distill", "true"]) == 2
    why = "distill = true adds DeiT's distillation token: train --arch deit"
    assert why in capsys.readouterr().err and not out.exists()


def test_mae_pretrains_draws_reconstructions_and_initialises_a_vit(tmp_path: Path, capsys) -> None:
    from attnlab.tensor_files import read_tensors

    root = _image_folder(tmp_path / "imgs")
    run = tmp_path / "mae"
    shape = ["--patch-size", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2"]
    shape += ["--d-ff", "32", "--decoder-d-model", "8", "--decoder-layers", "1"]
    shape += ["--decoder-heads", "2", "--decoder-d-ff", "16"]
    results = _train("mae", run, root, *shape)
    assert results["test_loss"] > 0 and (run / "reconstructions.png").stat().st_size > 1000
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m.get("split") == "train"]
    assert losses[-1] < losses[0]  # it learns to reconstruct
    vit = tmp_path / "vit"
    capsys.readouterr()
    _train("vision", vit, root, "--init", str(run), "--max-steps", "1", "--lr", "1e-9")
    assert "init: the encoder of MAE run" in capsys.readouterr().err
    config = json.loads((vit / "config.json").read_text())["model"]
    assert (config["d_model"], config["pos"], config["stem"]) == (16, "sincos2d", "patch")
    mae_w, vit_w = read_tensors(run / "model.safetensors"), read_tensors(vit / "model.safetensors")
    q = "encoder.blocks.0.self_attn.kv_proj.weight"
    assert (mae_w["encoder." + q] - vit_w[q]).abs().max() < 1e-6  # lr 1e-9: still the encoder
    c = ["train", "vision", "--arch", "cnn", "--out", str(tmp_path / "c"), "--init", str(run)]
    assert main(c) == 2
