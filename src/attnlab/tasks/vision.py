"""Image classification end to end with a ViT, a Swin, a DeiT student or a ResNet-style CNN
(+ SE/ECA/CBAM/CA).

``deit`` is :class:`~attnlab.models.vit.DeiT`, the ViT with a distillation token, trained with
DeiT's hard-label objective (Touvron et al. 2021, eq. 3): ½ CE(class head, label) +
½ CE(distillation head, argmax of the teacher), the teacher being a finished vision run
(``--teacher RUN``, e.g. a CNN+SE run) run in eval mode on the same augmented batch.

`attnlab train vision --arch vit|swin|cnn|deit` (model registry names; vit by default) chooses
the network. A run directory holds config.json ({"task": "vision", data, model (its "arch"
first), train}),
data_report.json (classes, image shape, normalisation, split sizes),
model.safetensors, metrics.jsonl, curves.png, state/, results.json and test_report.txt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.data import check_label_counts
from attnlab.data.images import (
    ImageData,
    ImageSet,
    channel_stats,
    check_report,
    load_fashion_mnist,
    load_idx_pair,
    load_image,
    load_image_folder,
    load_mnist,
    normalize,
)
from attnlab.data.io import read_json, write_json
from attnlab.data.splits import stratified_split
from attnlab.errors import UserError
from attnlab.metrics import classification_report, format_report
from attnlab.models.registry import model_entry
from attnlab.models.swin import Swin, SwinConfig
from attnlab.models.vit import DeiT, ViT, ViTConfig
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.tensor_files import load_tensors_into, read_tensors
from attnlab.train import StepOutput, TrainConfig

ARCHS = ("vit", "swin", "cnn", "deit")  # model registry names; the first is the default


@dataclass
class VisionConfig(ConfigBase):
    """Which images, how they are split and augmented, and the loss options."""

    dataset: Literal["fashion-mnist", "mnist", "folder", "idx"] = setting(
        "fashion-mnist", "fashion-mnist, mnist, folder or idx"
    )
    data: str = setting("", "folder: ROOT/<class>/*.png; idx: images")
    labels: str = setting("", "idx: the labels file of --data")
    test_data: str = setting("", "idx images / folder for testing")
    test_labels: str = setting("", "idx: labels of --test-data")
    channels: int = setting(0, "folder: 1 grey, 3 RGB; 0 = 3", min=0)
    resize: int = setting(0, "folder: resize images to N × N; 0 = keep", min=0)
    val_ratio: float = setting(0.1, "validation share of the train set")
    test_ratio: float = setting(0.1, "test share when no test set given")
    split_seed: int = setting(0)
    max_train: int = setting(0, "use at most N training images; 0 = all", min=0)
    crop_padding: int = setting(2, "random crop after zero padding by N", min=0)
    hflip: bool = setting(True, "random horizontal flips")
    label_smoothing: float = setting(0.1, min=0, below=1)
    teacher: str = setting("", "deit: the run folder of the teacher (e.g. a CNN+SE run)")
    init: str = setting("", "vit: start from the encoder of this MAE run (fine-tune)")
    eval_batch_size: int = setting(500, min=1)
    allow_rare_labels: bool = setting(
        False, "train even with classes of fewer than 5 training examples"
    )


def sections(arch: str) -> dict[str, type[ConfigBase]]:
    """Config sections of ``arch``: data, model (the registry entry's config) and train."""
    if arch not in ARCHS:
        raise UserError(f"unknown --arch {arch!r} for vision; one of {', '.join(ARCHS)}")
    return {"data": VisionConfig, "model": model_entry(arch).config, "train": TrainConfig}


def build_config(arch: str, preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/vision_<arch>.toml <- a user TOML (sections or flat keys) <- command
    line."""
    return training.build_config(TASK, preset, {**overrides, "arch": arch})


# ---------------------------------------------------------------------------- data


def load_splits(dcfg: VisionConfig) -> tuple[dict[str, ImageSet], str]:
    """train/val/test ImageSets and a description; val (and test if none given) are carved
    out of the training images by a stratified split seeded by ``split_seed``."""
    test: ImageSet | None = None
    if dcfg.dataset == "fashion-mnist":
        full, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    elif dcfg.dataset == "mnist":
        full, test = load_mnist("train"), load_mnist("test")
    elif dcfg.dataset == "idx":
        if not (dcfg.data and dcfg.labels):
            raise UserError("dataset=idx needs --data IMAGES.idx and --labels LABELS.idx")
        full = load_idx_pair(dcfg.data, dcfg.labels)
        if dcfg.test_data:
            if not dcfg.test_labels:
                raise UserError("--test-data with dataset=idx needs --test-labels as well")
            test = load_idx_pair(dcfg.test_data, dcfg.test_labels, full.classes)
    elif dcfg.dataset == "folder":
        if not dcfg.data:
            raise UserError("dataset=folder needs --data ROOT (one sub-folder per class)")
        channels = dcfg.channels or 3
        full = load_image_folder(dcfg.data, channels, dcfg.resize)
        if dcfg.test_data:
            test = load_image_folder(dcfg.test_data, channels, dcfg.resize or full.images.shape[-1])
            if test.classes != full.classes:
                raise UserError(
                    f"test classes {test.classes} differ from train classes {full.classes}"
                )
    else:
        raise UserError(
            f"dataset must be fashion-mnist, mnist, folder or idx; got {dcfg.dataset!r}"
        )
    labels = [str(int(y)) for y in full.labels]
    test_ratio = 0.0 if test is not None else dcfg.test_ratio
    split = stratified_split(
        labels, (1 - dcfg.val_ratio - test_ratio, dcfg.val_ratio, test_ratio), dcfg.split_seed
    )
    train_idx = split["train"]
    check_label_counts([labels[i] for i in train_idx], dcfg.allow_rare_labels)
    if dcfg.max_train:
        g = torch.Generator().manual_seed(dcfg.split_seed)
        keep = torch.randperm(len(train_idx), generator=g)[: dcfg.max_train].sort().values
        train_idx = [train_idx[i] for i in keep.tolist()]
    out = {"train": full.subset(train_idx), "val": full.subset(split["val"])}
    out["test"] = test if test is not None else full.subset(split["test"])
    if not len(out["val"]):
        raise UserError("the validation split is empty; set val_ratio > 0")
    return out, full.source


def step_fn(label_smoothing: float):
    """Cross-entropy with label smoothing; accuracy as a metric."""

    def step(model: nn.Module, batch: dict[str, Tensor]) -> StepOutput:
        logits = model(batch["images"])  # (B, n_classes)
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
        return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

    return step


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


def build_model(cfg: RunConfig) -> nn.Module:
    """The ViT, DeiT, Swin or CNN of a run config."""
    return model_entry(cfg.arch).build(cfg.model)


def distils(cfg: RunConfig) -> bool:
    """Whether ``--arch`` names a DeiT student, trained on a teacher's labels: its registry entry
    turns the distillation token on (the DeiT class refuses a config without it, the ViT one a
    config with it, so a changed ``distill`` ends in the model's own one-line refusal)."""
    return bool(model_entry(cfg.arch).defaults.get("distill", False))


def deit_step_fn(label_smoothing: float, teacher: VisionRun, mean: list[float], std: list[float]):
    """DeiT's hard-label distillation (Touvron et al. 2021, eq. 3): ½ CE(ψ(Z_s), y) +
    ½ CE(ψ(Z_d), y_t), y_t = argmax of the teacher on the same (augmented) images."""
    t_mean = torch.tensor(teacher.report["mean"])[None, :, None, None]
    t_std = torch.tensor(teacher.report["std"])[None, :, None, None]
    s_mean = torch.tensor(mean)[None, :, None, None]
    s_std = torch.tensor(std)[None, :, None, None]

    def step(model: DeiT, batch: dict[str, Tensor]) -> StepOutput:
        images, labels = batch["images"], batch["labels"]
        with torch.no_grad():  # the teacher sees the pixels in its own normalisation
            raw = images * s_std.to(images) + s_mean.to(images)
            y_teacher = teacher.model((raw - t_mean.to(images)) / t_std.to(images)).argmax(-1)
        cls_logits, dist_logits = model.heads(model.encoder(model.embed(images)))
        loss = 0.5 * F.cross_entropy(cls_logits, labels, label_smoothing=label_smoothing)
        loss = loss + 0.5 * F.cross_entropy(dist_logits, y_teacher)
        logits = model.logits(cls_logits, dist_logits)
        acc = (logits.argmax(-1) == labels).float().mean().item()
        agree = (dist_logits.argmax(-1) == y_teacher).float().mean().item()
        return StepOutput(
            loss=loss, weight=len(labels), metrics={"acc": acc, "teacher_agree": agree}
        )

    return step


MAE_SHAPE = ("patch_size", "d_model", "n_layers", "n_heads", "d_ff", "activation", "norm")


def adopt_mae_shape(cfg: RunConfig) -> str:
    """Give the ViT of ``cfg`` the shape of the MAE run ``cfg.data.init``'s encoder (patch stem,
    sin-cos positions, class token); returns the line that says so."""
    from attnlab.runs.folder import read_config

    raw = read_config(Path(cfg.data.init))
    if raw.get("task") != "mae":
        raise UserError(f"--init {cfg.data.init}: not an MAE run (task {raw.get('task')!r})")
    for name in MAE_SHAPE:
        setattr(cfg.model, name, raw["model"][name])
    cfg.model.norm_eps = raw["model"]["norm_eps"]
    cfg.model.pos, cfg.model.stem, cfg.model.pooling = "sincos2d", "patch", "cls"
    shape = ", ".join(f"{n} {raw['model'][n]}" for n in MAE_SHAPE)
    return f"init: the encoder of MAE run {cfg.data.init} ({shape})"


def load_mae_encoder(model: nn.Module, run_dir: Path) -> None:
    """The pretrained encoder's weights into ``model`` (a ViT of the same shape); the head and
    nothing else stays as initialised."""
    tensors = read_tensors(run_dir / WEIGHTS)
    encoder = {
        k.removeprefix("encoder."): v
        for k, v in tensors.items()
        if k.startswith("encoder.") and not k.startswith("encoder.head.")
    }
    missing, unexpected = model.load_state_dict(encoder, strict=False)
    if unexpected or set(missing) != {"head.weight", "head.bias"}:
        raise UserError(f"--init {run_dir}: weights do not fit this ViT ({missing or unexpected})")


def load_teacher(cfg: RunConfig, classes: list[str], shape: list[int]) -> VisionRun:
    """The teacher run of a deit config, checked against the student's data."""
    if not cfg.data.teacher:
        raise UserError("--arch deit needs --teacher RUN: a finished vision run to distil from")
    teacher = VisionRun.load(cfg.data.teacher)
    if teacher.classes != classes or list(teacher.report["image_shape"]) != list(shape):
        raise UserError(
            f"teacher {cfg.data.teacher} was trained on classes {teacher.classes} and images "
            f"{teacher.report['image_shape']}; the student has {classes} and {shape}"
        )
    teacher.model.eval()
    for p in teacher.model.parameters():
        p.requires_grad_(False)
    return teacher


def image_data(
    cfg: RunConfig, splits: dict[str, Any], source: str
) -> tuple[dict[str, Any], ImageData, ImageData]:
    """The data report (source, classes, shape, channel mean/std, split sizes) and the training
    and validation batches, normalised by the training split's channel statistics."""
    train_set = splits["train"]
    mean, std = channel_stats(train_set.images)
    report = {
        "source": source,
        "classes": train_set.classes,
        "image_shape": list(train_set.images.shape[1:]),
        "mean": mean,
        "std": std,
        "split_sizes": {k: len(v) for k, v in splits.items()},
    }
    dcfg = cfg.data
    train_data = ImageData(
        train_set, mean, std, cfg.train.batch_size, True, cfg.train.seed,
        dcfg.crop_padding, dcfg.hflip,
    )  # fmt: skip
    val_data = ImageData(splits["val"], mean, std, dcfg.eval_batch_size)
    return report, train_data, val_data


class VisionTask(Task):
    """Image classification with a ViT, a Swin, a DeiT student or a CNN (``--arch``)."""

    name = "vision"
    archs = ARCHS
    preset = "vision_{arch}"
    preset_prefix = "vision"
    resumable = frozenset({"eval_batch_size"})
    data_paths = ("data", "labels", "test_data", "test_labels")

    def sections(self) -> dict[str, type[ConfigBase]]:
        return sections(ARCHS[0])

    def arch_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        return sections(arch)

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        if cfg.data.teacher and not distils(cfg):
            raise UserError(f"--teacher applies to --arch deit, not {cfg.arch}")
        # an MAE encoder's weights fit the plain ViT alone (DeiT has a second token and head)
        if cfg.data.init and (not isinstance(cfg.model, ViTConfig) or distils(cfg)):
            raise UserError(f"--init (an MAE run) applies to --arch vit, not {cfg.arch}")
        init_message = adopt_mae_shape(cfg) if cfg.data.init else None
        splits, source = load_splits(cfg.data)
        train_set = splits["train"]
        c, h, w = train_set.images.shape[1:]
        if h != w:
            raise UserError(f"images are {h} × {w}; square images are needed (use --resize N)")
        cfg.model.in_channels = c
        cfg.model.n_classes = len(train_set.classes)
        if isinstance(cfg.model, ViTConfig | SwinConfig):
            cfg.model.image_size = h
            # re-validate the patch size against the data
            cfg.sections["model"] = type(cfg.model)(**to_dict(cfg.model))
        report, train_data, val_data = image_data(cfg, splits, source)
        self.report_stats = (report["mean"], report["std"])

        def evaluate(m: nn.Module) -> dict[str, float]:
            y_true, y_pred, loss = predict_dataset(m, val_data, device)
            acc = sum(int(a == b) for a, b in zip(y_true, y_pred)) / len(y_true)
            return {"val_loss": loss, "val_acc": acc}

        files = {"data_report.json": lambda path: write_json(path, report)}
        message = f"data: {source}; {report['split_sizes']}; images {c}×{h}×{w}"
        setup = Setup((splits, report), train_data, evaluate, files, [message])
        if init_message:
            setup.messages.append(init_message)
        if distils(cfg):
            self.teacher = load_teacher(cfg, train_set.classes, [c, h, w])
            setup.messages.append(f"teacher: {cfg.data.teacher} ({self.teacher.config.arch})")
        return setup

    def build_model(self, cfg: RunConfig, setup: Setup) -> nn.Module:
        model = build_model(cfg)
        if cfg.data.init:  # (on --resume the checkpoint's weights replace these)
            load_mae_encoder(model, Path(cfg.data.init))
        n_params = sum(p.numel() for p in model.parameters())
        setup.messages.append(f"model: {cfg.arch}, {n_params / 1e6:.3f}M parameters")
        return model

    def step(self, cfg: RunConfig):
        if distils(cfg):
            mean, std = self.report_stats
            return deit_step_fn(cfg.data.label_smoothing, self.teacher, mean, std)
        return step_fn(cfg.data.label_smoothing)

    def finish(
        self, cfg: RunConfig, setup: Setup, model: nn.Module, run_dir: Path, device: str
    ) -> dict[str, Any]:
        splits, report = setup.prepared
        mean, std = report["mean"], report["std"]
        test = evaluate_set(model, splits["test"], mean, std, cfg.data.eval_batch_size, device)
        (run_dir / "test_report.txt").write_text(format_report(test) + "\n", encoding="utf-8")
        return {
            "test": test,
            "n_params": sum(p.numel() for p in model.parameters()),
            "images_per_s": inference_speed(model, splits["test"], mean, std, device),
        }

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        test = results["test"]
        return [
            f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
            f"(n = {test['n']}); {results['n_params']:,} parameters; "
            f"{results['images_per_s']:.0f} images/s at inference",
        ]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> VisionRun:
        model = build_model(cfg)
        path = run_dir / WEIGHTS
        load_tensors_into(model, read_tensors(path), path)
        model.to(device).eval()
        keys = {"classes": list, "image_shape": list, "mean": list, "std": list}
        report = read_json(run_dir / "data_report.json", "data report", keys=keys)
        check_report(report, run_dir / "data_report.json", cfg.model)
        return VisionRun(run_dir, cfg, model, report)


TASK = VisionTask()


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


# ---------------------------------------------------------------------------- a trained run


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
