"""L2-SP: fine-tuning pulled toward the pretrained weights (Li, Grandvalet & Davoine 2018).

Li et al. regularise a fine-tuned network by the distance to its starting point instead of to
zero: Ω(w) = α/2 · ||w - w⁰||² over the pretrained parameters (their Eq. 3), so fine-tuning keeps
what the pretrained encoder knew unless the data pay for the change.

Two forms are here:

* :func:`l2sp_penalty` — the paper's coupled form, a term added to the loss. Under Adam its
  gradient α(w - w⁰) is divided by the running RMS of the whole gradient like any other, so the
  pull is strong where the data's gradients are small and weak where they are large: the same
  defect that made Loshchilov & Hutter (2019) decouple weight decay from Adam's update.
* :func:`pull_toward_` / :func:`attach_l2sp` — the decoupled form, applied in the optimizer step
  exactly as AdamW applies its weight decay but toward w⁰ instead of 0:
  w ← w - lr · α · (w - w⁰), before Adam's update, with the group's current (scheduled) lr.
  With w⁰ = 0 it *is* AdamW's decay (a test checks it against ``torch.optim.AdamW``). This is the
  form meant for the engine's AdamW: the pull does not depend on the gradients' scale, it follows
  the lr schedule, and the pretrained parameters need no decay toward zero besides (give them
  ``weight_decay = 0``: decaying toward 0 is the anchor L2-SP replaces).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn


def anchors(model: nn.Module, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Detached copies w⁰ of the trainable parameters of ``model`` (those named in ``names``
    when given): the point L2-SP pulls toward. Take them right after the pretrained weights are
    loaded, before any update."""
    wanted = None if names is None else set(names)
    return {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad and (wanted is None or name in wanted)
    }


def l2sp_penalty(
    model: nn.Module, anchor: Mapping[str, torch.Tensor], alpha: float
) -> torch.Tensor:
    """α/2 · Σ ||w - w⁰||² over the parameters named in ``anchor`` (Li et al. 2018, Eq. 3): a
    scalar to add to the loss (the coupled form)."""
    params = dict(model.named_parameters())
    total = sum(((params[name] - w0) ** 2).sum() for name, w0 in anchor.items())
    return 0.5 * alpha * total if anchor else torch.zeros(())


@torch.no_grad()
def pull_toward_(
    params: Iterable[torch.Tensor], targets: Iterable[torch.Tensor], lr: float, alpha: float
) -> None:
    """w ← w - lr · α · (w - w⁰) in place for each parameter and its anchor (the decoupled step;
    AdamW's decay is the case w⁰ = 0)."""
    params, targets = list(params), list(targets)
    if not params or not lr * alpha:
        return
    diffs = torch._foreach_sub(params, targets)  # w - w⁰ per tensor
    torch._foreach_add_(params, diffs, alpha=-lr * alpha)


def attach_l2sp(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    anchor: Mapping[str, torch.Tensor],
    alpha: float,
) -> torch.utils.hooks.RemovableHandle:
    """Make every ``optimizer.step()`` first pull the parameters named in ``anchor`` toward
    their anchors by ``lr · α`` (each with its own group's lr at that moment), as AdamW applies
    its decoupled weight decay before the Adam update. Returns the hook's handle."""
    params = dict(model.named_parameters())
    by_id = {id(params[name]): w0 for name, w0 in anchor.items()}

    def hook(opt: torch.optim.Optimizer, args, kwargs) -> None:
        for group in opt.param_groups:
            pairs = [(p, by_id[id(p)]) for p in group["params"] if id(p) in by_id]
            if pairs:
                ps, w0s = zip(*pairs)
                pull_toward_(ps, w0s, group["lr"], alpha)

    return optimizer.register_step_pre_hook(hook)
