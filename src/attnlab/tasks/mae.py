"""Masked-autoencoder pretraining (MAE) on images without their labels, then fine-tuning.

``attnlab train mae`` trains :class:`attnlab.models.mae.MAE` on the training split's images
(labels unused; the same splits, augmentation and normalisation as the vision task), selects
the weights by the validation reconstruction loss (masked patches, a fixed noise per image so
that every evaluation hides the same patches), and draws test images, their masked version and
the reconstruction in ``reconstructions.png``. ``attnlab train vision --init RUN`` then fine-tunes
the pretrained encoder as a ViT classifier (the ViT's shape is taken from the MAE run).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.configs import to_dict
from attnlab.data.image_splits import VisionConfig, image_data, load_splits
from attnlab.data.images import ImageData
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError
from attnlab.models.mae import MAE, MAEConfig
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.tensor_files import load_tensors_into, read_tensors
from attnlab.train import StepOutput, TrainConfig

EVAL_NOISE_SEED = 1234


def fixed_noise(n_images: int, n_patches: int, start: int = 0) -> Tensor:
    """The masking noise of images start..start+n−1 of an evaluation set: the same every time."""
    g = torch.Generator().manual_seed(EVAL_NOISE_SEED)
    return torch.rand(start + n_images, n_patches, generator=g)[start:]


@torch.no_grad()
def reconstruction_loss(model: MAE, data: ImageData, device: str = "cpu") -> float:
    """Mean masked-patch loss over ``data`` (in order, fixed noise), weighted by images."""
    was_training = model.training
    model.eval()
    n = (model.cfg.image_size // model.cfg.patch_size) ** 2
    total, count, seen = 0.0, 0, 0
    for indices in data.batches(0):
        images = data.collate(indices)["images"].to(device)
        noise = fixed_noise(len(indices), n, seen).to(device)
        total += model(images, noise)["loss"].item() * len(indices)
        count += len(indices)
        seen += len(indices)
    model.train(was_training)
    return total / max(count, 1)


def step(model: nn.Module, batch: dict[str, Tensor]) -> StepOutput:
    out = model(batch["images"])  # labels unused
    return StepOutput(loss=out["loss"], weight=len(batch["images"]), metrics={})


class MAETask(Task):
    """Masked-autoencoder pretraining of a ViT encoder on images."""

    name = "mae"
    preset = "mae"
    preset_prefix = "mae"

    def sections(self) -> dict[str, type]:
        return {"data": VisionConfig, "model": MAEConfig, "train": TrainConfig}

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        splits, source = load_splits(cfg.data)
        train_set = splits["train"]
        c, h, w = train_set.images.shape[1:]
        if h != w:
            raise UserError(f"images are {h} × {w}; square images are needed (use --resize N)")
        cfg.model.in_channels, cfg.model.image_size = c, h
        cfg.model.n_classes = len(train_set.classes)
        cfg.sections["model"] = MAEConfig(**to_dict(cfg.model))  # re-validate
        report, train_data, val_data = image_data(cfg, splits, source)

        def evaluate(m: nn.Module) -> dict[str, float]:
            return {"val_loss": reconstruction_loss(m, val_data, device)}

        files = {"data_report.json": lambda path: write_json(path, report)}
        message = f"data: {source}; {report['split_sizes']}; images {c}×{h}×{w} (labels unused)"
        return Setup((splits, report), train_data, evaluate, files, [message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> nn.Module:
        model = MAE(cfg.model)
        n = sum(p.numel() for p in model.parameters())
        setup.messages.append(
            f"model: mae, {n / 1e6:.3f}M parameters (mask {cfg.model.mask_ratio})"
        )
        return model

    def step(self, cfg: RunConfig):
        return step

    def finish(
        self, cfg: RunConfig, setup: Setup, model: nn.Module, run_dir: Path, device: str
    ) -> dict[str, Any]:
        splits, report = setup.prepared
        test = ImageData(splits["test"], report["mean"], report["std"], cfg.data.eval_batch_size)
        loss = reconstruction_loss(model, test, device)
        plot_reconstructions(model, test, run_dir / "reconstructions.png", device)
        return {"test_loss": loss, "n_params": sum(p.numel() for p in model.parameters())}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        return [
            f"test reconstruction loss {results['test_loss']:.4f} (masked patches); "
            f"{results['n_params']:,} parameters; pictures in {run_dir}/reconstructions.png",
            f"fine-tune the encoder: attnlab train vision --init {run_dir}",
        ]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> MAERun:
        model = MAE(cfg.model)
        path = run_dir / WEIGHTS
        load_tensors_into(model, read_tensors(path), path)
        model.to(device).eval()
        return MAERun(run_dir, cfg, model, read_json(run_dir / "data_report.json", "data report"))


class MAERun(Run):
    """A pretrained masked autoencoder; its encoder initialises ViTs (``--init``)."""

    verbs = ()

    def __init__(self, run_dir: Path, config: RunConfig, model: MAE, report: dict) -> None:
        super().__init__(run_dir, config)
        self.model, self.report = model, report


@torch.no_grad()
def plot_reconstructions(
    model: MAE, data: ImageData, out: Path, device: str = "cpu", n: int = 8
) -> Path:
    """Rows: original, masked (hidden patches blue), reconstruction (visible patches pasted
    back), for the first ``n`` images of ``data`` with the evaluation's fixed noise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = data.collate(list(range(min(n, len(data)))))["images"].to(device)
    patches = (model.cfg.image_size // model.cfg.patch_size) ** 2
    rec = model.reconstruct(batch, fixed_noise(len(batch), patches).to(device))
    cmap = plt.get_cmap("gray").copy()
    cmap.set_bad("#6baed6")
    rows = [("original", batch), ("masked", rec["masked"]), ("MAE", rec["reconstruction"])]
    fig, axes = plt.subplots(3, len(batch), figsize=(1.3 * len(batch), 4.2), squeeze=False)
    for r, (title, images) in enumerate(rows):
        for i in range(len(batch)):
            img = images[i].cpu()
            shown = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
            if title == "masked":  # hidden patches in a colour no grey pixel has (NaN = "bad")
                p = model.cfg.patch_size
                hidden = rec["mask"][i].view(model.cfg.image_size // p, -1).cpu()
                hidden = hidden.repeat_interleave(p, 0).repeat_interleave(p, 1).bool()
                shown = shown.clone()
                shown[hidden] = float("nan")
            axes[r, i].imshow(shown.numpy(), cmap=cmap if img.shape[0] == 1 else None)
            axes[r, i].axis("off")
        axes[r, 0].set_title(title, fontsize=8, loc="left")
    fig.suptitle(f"MAE: {int(model.cfg.mask_ratio * 100)}% of patches hidden", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


TASK = MAETask()
