"""A trained vision run, loaded for use: predict, evaluate, the attention rollout of an image."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.image_splits import load_splits
from attnlab.data.images import ImageData, ImageSet, load_image, load_image_folder, normalize
from attnlab.errors import UserError
from attnlab.metrics import classification_report
from attnlab.models.swin import Swin
from attnlab.models.vit import ViT
from attnlab.runs.task import Run, RunConfig


@torch.no_grad()
def predict_dataset(
    model: nn.Module, data: ImageData, device: str = "cpu"
) -> tuple[list[int], list[int], float]:
    """(true labels, predictions, mean cross-entropy) over ``data`` in order."""
    was_training = model.training
    model.eval()
    y_true: list[int] = []
    y_pred: list[int] = []
    loss = 0.0
    for indices in data.batches(0):
        batch = data.collate(indices)
        logits = model(batch["images"].to(device))
        loss += F.cross_entropy(logits, batch["labels"].to(device), reduction="sum").item()
        y_true += batch["labels"].tolist()
        y_pred += logits.argmax(-1).tolist()
    model.train(was_training)
    return y_true, y_pred, loss / max(len(data), 1)


def evaluate_set(
    model: nn.Module, data: ImageSet, mean: list[float], std: list[float], batch: int, device: str
) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class report and confusion matrix, plus the mean loss."""
    y_true, y_pred, loss = predict_dataset(model, ImageData(data, mean, std, batch), device)
    report = classification_report(y_true, y_pred, data.classes)
    report["loss"] = loss
    return report


@torch.no_grad()
def inference_speed(
    model: nn.Module, data: ImageSet, mean: list[float], std: list[float], device: str = "cpu"
) -> float:
    """Images per second of eval-mode forward passes in batches of 256 (at most 2048 images)."""
    model.eval()
    images = normalize(data.images[:2048], mean, std).to(device)
    model(images[:8])  # warm-up
    start = time.perf_counter()
    for i in range(0, len(images), 256):
        model(images[i : i + 256])
    return len(images) / (time.perf_counter() - start)


class VisionRun(Run):
    """A trained vision run loaded for inference."""

    verbs = ("predict", "evaluate", "attention")

    def __init__(
        self, run_dir: Path, config: RunConfig, model: nn.Module, report: dict[str, Any]
    ) -> None:
        super().__init__(run_dir, config)
        self.model, self.report = model, report

    @property
    def explore_page(self) -> str:  # type: ignore[override]
        """The explorer's page of the model: "vit" (ViT, DeiT and Swin), or "cnn"."""
        return "vit" if isinstance(self.model, ViT | Swin) else "cnn"

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> VisionRun:
        from attnlab.runs.load import load_run_of

        return load_run_of(run_dir, cls, "a vision run", device)  # type: ignore[return-value]

    @property
    def classes(self) -> list[str]:
        return self.report["classes"]

    def load_images(self, paths: list[str]) -> Tensor:
        """Image files -> uint8 (B, C, H, W) in the run's channels and size."""
        c, h, _ = self.report["image_shape"]
        return torch.stack([load_image(p, c, h) for p in paths])

    @torch.no_grad()
    def predict(self, paths: list[str]) -> list[dict[str, Any]]:
        """Label and per-class probabilities for each image file."""
        x = normalize(self.load_images(paths), self.report["mean"], self.report["std"])
        probs = torch.softmax(self.model(x.to(self.device)).float(), dim=-1).cpu()  # (B, C)
        out = []
        for path, p in zip(paths, probs):
            k = int(p.argmax())
            probs_by_class = {name: float(p[i]) for i, name in enumerate(self.classes)}
            out.append({"image": path, "label": self.classes[k], "probs": probs_by_class})
        return out

    def evaluate(self, data: str | None = None, split: str = "test", **_: Any) -> dict[str, Any]:
        """Report on the run's own split, or on an image folder with the same classes."""
        if data:
            c, h, _ = self.report["image_shape"]
            images = load_image_folder(data, c, h)
            if images.classes != self.classes:
                raise UserError(f"{data}: classes {images.classes} differ from {self.classes}")
        else:
            images = load_splits(self.config.data)[0][split]
        mean, std = self.report["mean"], self.report["std"]
        batch = self.config.data.eval_batch_size
        return evaluate_set(self.model, images, mean, std, batch, self.device)  # type: ignore[arg-type]

    def draw_attention(self, image: str, out: str | None, member: int = 1) -> list[str]:
        """The attention rollout of a ViT (Swin: attention received) over ``image``, drawn."""
        if member != 1:
            raise UserError("--member applies to ensemble classifier runs, not vision runs")
        picture, rollout, pred = self.rollout(image)
        path = Path(out) if out else self.run_dir / "rollout.png"
        title = f"{Path(image).name} → {pred['label']} ({pred['probs'][pred['label']]:.2f})"
        plot_rollout(picture, rollout, path, title)
        g, k = rollout.shape[0], int(rollout.argmax())
        return [
            f"{pred['label']} ({pred['probs'][pred['label']]:.3f}); most attended patch: "
            f"row {k // g}, column {k % g} of {g}×{g} ({rollout.max():.3f})",
            f"rollout written to {path}",
        ]

    def rollout(self, path: str) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """The image (C, H, W) uint8, its attention map (G, G) and the prediction: the rollout
        of a ViT/DeiT, or for a Swin the attention each first-stage token receives."""
        from attnlab.models.swin import attention_received
        from attnlab.models.vit import rollout_map

        if not isinstance(self.model, ViT | Swin):
            raise UserError("this run is a CNN: the attention map needs a ViT, DeiT or Swin run")
        image = self.load_images([path])  # (1, C, H, W)
        x = normalize(image, self.report["mean"], self.report["std"])
        x = x.to(self.device)
        if isinstance(self.model, Swin):
            heat = attention_received(self.model, x)[0].cpu()  # (G, G)
        else:
            heat = rollout_map(self.model, x)[0].cpu()  # (G, G)
        return image[0], heat, self.predict([path])[0]


def plot_rollout(image: Tensor, rollout: Tensor, out: str | Path, title: str) -> Path:
    """The image and the image overlaid with its rollout map (upsampled to the image size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, w = image.shape[1:]
    heat = F.interpolate(rollout[None, None], size=(h, w), mode="bilinear")[0, 0]
    shown = image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)
    cmap = "gray" if image.shape[0] == 1 else None
    fig, axes = plt.subplots(1, 2, figsize=(6, 3.3))
    axes[0].imshow(shown.numpy(), cmap=cmap)
    axes[0].set_title("image")
    axes[1].imshow(shown.numpy(), cmap=cmap)
    axes[1].imshow(heat.numpy(), cmap="jet", alpha=0.5)
    axes[1].set_title("attention rollout")
    for ax in axes:
        ax.axis("off")
    fig.suptitle(title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
