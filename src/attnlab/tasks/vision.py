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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, to_dict
from attnlab.data.image_splits import VisionConfig, image_data, load_splits
from attnlab.data.images import check_report
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError
from attnlab.infer.vision import VisionRun, evaluate_set, inference_speed, predict_dataset
from attnlab.metrics import format_report
from attnlab.models.registry import model_entry
from attnlab.models.swin import SwinConfig
from attnlab.models.vit import DeiT, ViTConfig
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import RunConfig, Setup, Task
from attnlab.tensor_files import load_tensors_into, read_tensors
from attnlab.train import StepOutput, TrainConfig

ARCHS = ("vit", "swin", "cnn", "deit")  # model registry names; the first is the default


def sections(arch: str) -> dict[str, type[ConfigBase]]:
    """Config sections of ``arch``: data, model (the registry entry's config) and train."""
    if arch not in ARCHS:
        raise UserError(f"unknown --arch {arch!r} for vision; one of {', '.join(ARCHS)}")
    return {"data": VisionConfig, "model": model_entry(arch).config, "train": TrainConfig}


def build_config(arch: str, preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/vision_<arch>.toml <- a user TOML (sections or flat keys) <- command
    line."""
    return training.build_config(TASK, preset, {**overrides, "arch": arch})


def step_fn(label_smoothing: float):
    """Cross-entropy with label smoothing; accuracy as a metric."""

    def step(model: nn.Module, batch: dict[str, Tensor]) -> StepOutput:
        logits = model(batch["images"])  # (B, n_classes)
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
        return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

    return step


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


