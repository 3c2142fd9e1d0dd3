"""Layer-wise learning-rate decay: lower layers of a pretrained encoder move less.

Howard & Ruder (2018, "discriminative fine-tuning") and the BERT/ELECTRA fine-tuning recipes
(Sun et al. 2019; Clark et al. 2020) give each layer its own rate: lr · decay^d, where d is the
layer's depth counted from the top. Here the head (and anything above the encoder's blocks, such
as a pooler) has d = 0 and trains at lr, the top block d = 1, the block below d = 2, …, the
bottom block d = L and the embeddings d = L + 1, the lowest rate. Lower layers hold the more
general, language-level features, so they are changed least.

:func:`lr_scales` maps each trainable parameter to its factor decay^d; :func:`scaled_groups`
splits any optimizer param groups (such as the engine's decay / no-decay groups) into one
sub-group per factor, each carrying ``lr_scale`` and ``lr = base_lr · lr_scale``. An engine that
schedules the lr must set each group's lr to the scheduled rate times its ``lr_scale``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from attnlab.errors import UserError


def depths(stages: Sequence[nn.Module], model: nn.Module) -> dict[int, int]:
    """{id(parameter): depth from the top} for the trainable parameters of ``model``:
    ``stages`` lists the encoder's stages bottom to top (the embeddings, then each block); stage
    k of S has depth S - k, every parameter in no stage (the head) depth 0."""
    out: dict[int, int] = {}
    for k, stage in enumerate(stages):
        for p in stage.parameters():
            if id(p) in out:
                raise UserError("a parameter belongs to two stages; list each layer once")
            out[id(p)] = len(stages) - k
    return {id(p): out.get(id(p), 0) for p in model.parameters() if p.requires_grad}


def bert_stages(model: nn.Module) -> list[nn.Module]:
    """The stages of a BERT classifier (``model.bert``) bottom to top: embeddings, blocks."""
    return [model.bert.embeddings, *model.bert.encoder.blocks]


def lr_scales(stages: Sequence[nn.Module], model: nn.Module, decay: float) -> dict[int, float]:
    """{id(parameter): decay ** depth} for the trainable parameters of ``model``."""
    if not 0 < decay <= 1:
        raise UserError(f"layer-wise lr decay {decay}: give a factor in (0, 1]")
    return {pid: decay**d for pid, d in depths(stages, model).items()}


def scaled_groups(groups: Sequence[dict], scales: dict[int, float], lr: float) -> list[dict]:
    """Each of ``groups`` (dicts with "params" and any options, such as weight_decay) split
    into one group per lr factor, in the order the factors first appear; each new group keeps
    its parent's options and adds ``lr_scale`` and ``lr = lr · lr_scale``."""
    out: list[dict] = []
    for group in groups:
        by_scale: dict[float, list[torch.Tensor]] = {}
        for p in group["params"]:
            by_scale.setdefault(scales[id(p)], []).append(p)
        for scale, params in by_scale.items():
            out.append({**group, "params": params, "lr_scale": scale, "lr": lr * scale})
    return out
