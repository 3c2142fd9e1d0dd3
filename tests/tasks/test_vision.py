"""Vision data (idx, folders, augmentation) and the CLI end to end on a tiny image folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.data.images import (
    ImageData,
    ImageSet,
    load_fashion_mnist,
    load_idx_pair,
    load_image_folder,
    random_crop_flip,
    read_idx,
)


def _write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_files_round_trip(tmp_path: Path, compress: bool) -> None:
    images = np.random.randint(0, 256, (5, 4, 3))
    labels = np.array([0, 2, 1, 2, 0])
    _write_idx(tmp_path / "x.idx", images, compress)
    _write_idx(tmp_path / "y.idx", labels, compress)
    assert np.array_equal(read_idx(tmp_path / "x.idx"), images)
    data = load_idx_pair(tmp_path / "x.idx", tmp_path / "y.idx")
    assert data.images.shape == (5, 1, 4, 3) and data.labels.tolist() == labels.tolist()
    assert data.classes == ["0", "1", "2"]


def test_bad_or_missing_data_say_how_to_fix(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bad.idx").write_bytes(b"\x89PNG....")
    with pytest.raises(ValueError, match="idx"):
        read_idx(tmp_path / "bad.idx")
    monkeypatch.setenv("ATTNLAB_FASHION_MNIST", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("train")
    with pytest.raises(ValueError, match="sub-folder"):
        load_image_folder(tmp_path)


def test_random_crop_is_a_shifted_window_and_flip_mirrors() -> None:
    images = torch.randint(1, 256, (6, 2, 5, 5), dtype=torch.uint8)
    out = random_crop_flip(images, padding=2, flip=True)
    padded = torch.nn.functional.pad(images, (2,) * 4)
    for i in range(6):
        windows = [padded[i, :, dy : dy + 5, dx : dx + 5] for dy in range(5) for dx in range(5)]
        candidates = windows + [w.flip(-1) for w in windows]
        assert any(torch.equal(out[i], w) for w in candidates)
    # Over many draws all offsets and both orientations occur (P(one missing) < 1e-30).
    many = random_crop_flip(images[:1].expand(4000, -1, -1, -1), padding=2, flip=True)
    distinct = {tuple(m.flatten().tolist()) for m in many}
    assert len(distinct) == 50  # 25 offsets × 2 orientations


def test_augmentation_follows_torch_global_rng_so_resume_replays_it() -> None:
    data = ImageSet(
        torch.randint(0, 256, (8, 1, 6, 6), dtype=torch.uint8), torch.arange(8) % 2, ["a", "b"], "t"
    )
    d = ImageData(data, [0.5], [0.25], 4, shuffle=True, seed=3, crop_padding=1, hflip=True)
    state = torch.get_rng_state()  # what the engine checkpoints
    first = d.collate([0, 1, 2, 3])["images"]
    torch.set_rng_state(state)
    again = d.collate([0, 1, 2, 3])["images"]
    assert torch.equal(first, again)
    assert not torch.equal(first, d.collate([0, 1, 2, 3])["images"])  # fresh draws next time
    assert d.batches(1) == d.batches(1) != d.batches(2)
    plain = ImageData(data, [0.5], [0.25], 4).collate([5])
    torch.testing.assert_close(plain["images"], (data.images[5:6].float() / 255 - 0.5) / 0.25)


def _image_folder(root: Path, n: int = 12) -> Path:
    """Two classes of 12×12 grey images: bright top half or bright bottom half, with noise."""
    rng = np.random.default_rng(0)
    for name, rows in (("bottom", slice(6, 12)), ("top", slice(0, 6))):
        (root / name).mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 60, (12, 12))
            img[rows] += 180
            Image.fromarray(img.astype(np.uint8), "L").save(root / name / f"{i}.png")
    return root


def test_image_folder_loader(tmp_path: Path) -> None:
    root = _image_folder(tmp_path / "imgs", n=3)
    data = load_image_folder(root, channels=1)
    assert data.classes == ["bottom", "top"] and data.images.shape == (6, 1, 12, 12)
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert data.images[0, 0, 6:].float().mean() > data.images[0, 0, :6].float().mean() + 100
    rgb = load_image_folder(root, channels=3, size=8)
    assert rgb.images.shape == (6, 3, 8, 8)


def test_cli_train_eval_predict_attention_end_to_end(tmp_path: Path, capsys) -> None:
    root = _image_folder(tmp_path / "imgs")
    common = [
        "--dataset", "folder", "--data", str(root), "--channels", "1",
        "--val-ratio", "0.25", "--test-ratio", "0.25", "--max-steps", "40", "--batch-size", "8",
        "--eval-every", "40", "--lr", "1e-2", "--tensorboard", "false", "--max-minutes", "0",
        "--keep-state", "true",
        "--precision", "fp32",
    ]  # fmt: skip
    vit_args = ["--patch-size", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2"]
    run = tmp_path / "vit"
    assert main(["train", "vision", "--out", str(run), *common, *vit_args, "--d-ff", "32"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["test"]["accuracy"] == 1.0  # top vs bottom is trivially separable
    assert results["images_per_s"] > 0 and results["n_params"] > 0
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "vision" and config["format"] == 2
    assert next(iter(config["model"].items())) == ("arch", "vit")  # the default, recorded first
    assert config["model"]["image_size"] == 12 and config["model"]["n_classes"] == 2
    capsys.readouterr()

    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0
    top = str(root / "top" / "0.png")
    assert main(["predict", str(run), top, str(root / "bottom" / "1.png")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["top", "bottom"]
    out_png = tmp_path / "rollout.png"
    assert main(["attention", str(run), top, "--out", str(out_png)]) == 0
    assert out_png.stat().st_size > 1000 and "rollout written" in capsys.readouterr().out

    cnn = tmp_path / "cnn"
    cnn_args = ["--channel-attention", "cbam", "--width", "8", "--stages", "2", "--reduction", "4"]
    assert main(["train", "vision", "--arch", "cnn", "--out", str(cnn), *common, *cnn_args]) == 0
    config = json.loads((cnn / "config.json").read_text())
    assert config["task"] == "vision" and config["model"]["arch"] == "cnn"
    assert config["model"]["channel_attention"] == "cbam"
    assert main(["attention", str(cnn), top]) == 2  # rollout needs a ViT: a clear error
    assert "needs a ViT" in capsys.readouterr().err
    # a resume takes the architecture the run records (cnn's options, no --arch) and keeps it
    resume = ["train", "vision", "--out", str(cnn), "--resume", "--max-steps", "42"]
    assert main([*resume, "--channel-attention", "cbam"]) == 0
    assert json.loads((cnn / "config.json").read_text())["model"]["arch"] == "cnn"
    capsys.readouterr()
    assert main(["predict", str(cnn), top]) == 0 and capsys.readouterr().out.startswith("top")
    assert main([*resume, "--arch", "vit"]) == 2
    assert "--arch cannot change when resuming" in capsys.readouterr().err
    assert main(["train", "vision", "--dataset", "folder", "--out", str(tmp_path / "x")]) == 2
    assert "--data ROOT" in capsys.readouterr().err
