"""Knowledge distillation: a classifier trained on a teacher's soft labels as well as the true
ones (Hinton, Vinyals & Dean 2015, §2). The student minimises

    L = α · T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)) + (1 − α) · CE(z_s, y)

with z_t the teacher's logits, z_s the student's, T the temperature (soft targets carry the
teacher's "dark knowledge" about which wrong classes are close) and T² keeping the soft term's
gradients on the scale of the hard one's as T changes. The teacher's logits are computed once for
every training text, read by the teacher's own reader, and ride along in each batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting


@dataclass
class DistillConfig(ConfigBase):
    """Where the soft labels come from and how much they weigh (no teacher: no distillation)."""

    teacher: str = setting("", "a trained classify run whose soft labels the model also learns")
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
    """α · T² · KL(p_t^T ‖ p_s^T) + (1 − α) · CE(z_s, y), averaged over the batch.

    student, teacher: logits (B, C); labels (B,)."""
    T = temperature
    log_p_s = F.log_softmax(student / T, dim=-1)  # (B, C)
    log_p_t = F.log_softmax(teacher / T, dim=-1)  # (B, C)
    soft = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean") * T * T
    hard = F.cross_entropy(student, labels, label_smoothing=label_smoothing)
    return alpha * soft + (1.0 - alpha) * hard


@torch.no_grad()
def teacher_logits(teacher: Any, texts: list[str], batch_size: int) -> torch.Tensor:
    """The logits (N, C) of a trained classifier run (``encode`` reads texts its own way,
    ``model`` scores them) for ``texts``."""
    teacher.model.eval()
    out = []
    for start in range(0, len(texts), batch_size):
        ids, lengths = teacher.encode(texts[start : start + batch_size])
        out.append(teacher.model(ids, lengths).float())  # (B, C)
    return torch.cat(out)


class SoftLabels:
    """Training data whose batches also carry the teacher's logits (``teacher``, (B, C)):
    any dataset with ``batches``, ``collate`` and ``labels`` (token ids or kept states)."""

    def __init__(self, data: Any, logits: torch.Tensor) -> None:
        if len(logits) != len(data.labels):
            raise ValueError(f"{len(logits)} teacher rows for {len(data.labels)} examples")
        self.data, self.logits = data, logits  # (N, C), in the order of ``data``
        self.labels = data.labels

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, epoch: int) -> list[list[int]]:
        return self.data.batches(epoch)

    def collate(self, indices: Any) -> dict[str, Any]:
        batch = self.data.collate(indices)
        batch["teacher"] = self.logits[list(indices)]  # (B, C)
        return batch

    def num_tokens(self, batch: dict) -> int:
        return self.data.num_tokens(batch)
