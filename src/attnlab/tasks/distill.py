"""``attnlab train distill --teacher RUN``: a classifier trained on a teacher's soft labels.

Knowledge distillation (Hinton, Vinyals & Dean 2015, §2): the student minimises

    L = α · T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)) + (1 − α) · CE(z_s, y)

with z_t the teacher's logits, z_s the student's, T the temperature (soft targets carry the
teacher's "dark knowledge" about which wrong classes are close) and T² keeping the soft term's
gradients on the scale of the hard one's as T changes. The task is ``classify`` with one more
section, ``[distill]``: the teacher's logits are computed once for every training text (with
the teacher's own tokenizer) and ride along in each batch. The result is an ordinary classifier
run (predict, eval, attention, prune, explore).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting
from attnlab.data import ClassificationData
from attnlab.errors import UserError
from attnlab.runs.task import RunConfig, Setup
from attnlab.tasks.classify import SECTIONS, ClassifyTask, Prepared
from attnlab.train import StepOutput


@dataclass
class DistillConfig(ConfigBase):
    """Where the soft labels come from and how much they weigh."""

    teacher: str = setting("", "the teacher: a classify (or bert_classify) run folder")
    temperature: float = setting(2.0, "softmax temperature T of both sides' soft labels", min=0.05)
    alpha: float = setting(
        0.5, "weight of the soft-label term (1 − α on the true labels)", min=0.0, max=1.0
    )
    teacher_batch_size: int = setting(256, "texts per teacher forward pass", min=1)


def distillation_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    alpha: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """α · T² · KL(p_t^T ‖ p_s^T) + (1 − α) · CE(z_s, y), averaged over the batch (Hinton 2015).

    student, teacher: logits (B, C); labels (B,)."""
    T = temperature
    log_p_s = F.log_softmax(student / T, dim=-1)  # (B, C)
    log_p_t = F.log_softmax(teacher / T, dim=-1)  # (B, C)
    soft = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean") * T * T
    hard = F.cross_entropy(student, labels, label_smoothing=label_smoothing)
    return alpha * soft + (1.0 - alpha) * hard


class SoftLabelData(ClassificationData):
    """Training data whose batches also carry the teacher's logits (``teacher``, (B, C))."""

    def __init__(self, data: ClassificationData, teacher_logits: torch.Tensor) -> None:
        super().__init__(data.sequences, data.labels, data.sampler, data.pad_id)
        self.teacher_logits = teacher_logits  # (N, C), in the order of ``data``

    def collate(self, indices: Any) -> dict[str, torch.Tensor]:
        batch = super().collate(indices)
        batch["teacher"] = self.teacher_logits[list(indices)]  # (B, C)
        return batch


def teacher_inputs(teacher: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts -> the teacher's padded ids (B, T) and lengths (B,), with its own tokenizer: a
    classify run encodes characters itself, a bert_classify run by WordPiece up to its
    max_len (the texts are training texts, never blank)."""
    if hasattr(teacher, "encode"):
        return teacher.encode(texts)
    from attnlab.data import pad_batch

    seqs = teacher.tokenizer.encode_batch(texts, teacher.max_len)
    return pad_batch(seqs, teacher.tokenizer.pad_id)


def is_classifier(teacher: Any) -> bool:
    """A run distill can read: classify's (encode) or bert_classify's (WordPiece tokenizer)."""
    readable = hasattr(teacher, "encode") or hasattr(teacher, "max_len")
    return readable and hasattr(teacher, "labels") and hasattr(teacher, "model")


@torch.no_grad()
def teacher_logits(teacher: Any, texts: list[str], batch_size: int) -> torch.Tensor:
    """The teacher run's logits (N, C) for ``texts``, read with its own tokenizer."""
    teacher.model.eval()
    out = []
    for start in range(0, len(texts), batch_size):
        ids, lengths = teacher_inputs(teacher, texts[start : start + batch_size])
        out.append(teacher.model(ids, lengths).float())  # (B, C)
    return torch.cat(out)


class DistillTask(ClassifyTask):
    """Classification trained on a teacher's soft labels as well as the true ones."""

    name = "distill"
    # the teacher is saved resolved and recorded by its weights' sha256 (datafiles): a resume
    # from another folder finds it, and a resume after it was retrained is refused
    data_paths = (*ClassifyTask.data_paths, "teacher")
    train_only_paths = ("teacher",)  # evaluating the student needs no teacher
    redirect = None  # the student is always the character model (no --init)

    def sections(self) -> dict[str, type]:
        return {**SECTIONS, "distill": DistillConfig}

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        if not cfg.distill.teacher:
            raise UserError("distill needs a teacher: --teacher RUN (a trained classify run)")
        if cfg.model.members > 1:
            raise UserError("distill trains one student; set members = 1")

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        from attnlab.runs.load import load_run

        setup = super().setup(cfg, run_dir, resume, device)
        teacher = load_run(cfg.distill.teacher)
        if not is_classifier(teacher):
            raise UserError(f"{cfg.distill.teacher} holds a {teacher.task!r} run, not a classifier")
        prep: Prepared = setup.prepared
        if list(teacher.labels.labels) != list(prep.labels.labels):
            raise UserError(
                f"the teacher's classes {teacher.labels.labels} differ from the data's "
                f"{prep.labels.labels}; distil on the data the teacher was trained for"
            )
        texts, _ = prep.texts_of("train")  # as the student reads them: lexicon words included
        logits = teacher_logits(teacher, texts, cfg.distill.teacher_batch_size)
        setup.train_data = SoftLabelData(setup.train_data, logits)
        d = cfg.distill
        setup.messages.append(
            f"distillation: teacher {d.teacher}, T = {d.temperature}, α = {d.alpha}"
        )
        return setup

    def step(self, cfg: RunConfig):
        d, smoothing = cfg.distill, cfg.data.label_smoothing

        def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
            logits = model(batch["input_ids"], batch["lengths"])  # (B, C)
            loss = distillation_loss(
                logits, batch["teacher"], batch["labels"], d.temperature, d.alpha, smoothing
            )
            acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
            return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

        return step


TASK = DistillTask()
