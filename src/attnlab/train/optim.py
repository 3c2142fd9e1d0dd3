"""The engine's optimizers: AdamW with the usual no-decay groups, or Muon + AdamW (MuonAdamW)."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.train.config import TrainConfig
from attnlab.train.muon import NS_COEFFICIENTS, NS_EPS, MuonAdamW

ADAM_EPS = 1e-8  # torch.optim.AdamW's default


def _no_decay(model: nn.Module) -> set[int]:
    """ids of the params AdamW must not decay: ndim < 2, nn.Embedding weights (also when tied to
    an output layer), and the names listed by an optional `model.no_weight_decay()`."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    extra = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    return {
        id(p)
        for name, p in model.named_parameters()
        if p.ndim < 2 or id(p) in embedding_ids or name in extra
    }


def param_groups(
    model: nn.Module, weight_decay: float, exclude: set[int] = frozenset(), lr_decay: float = 1.0
) -> list:
    """Split trainable params (other than the ids in `exclude`) into a decayed group and a
    no-decay group.

    Decayed: tensors with ndim >= 2 (Linear/attention/conv weights). Not decayed: biases and
    norm gains (ndim < 2), every nn.Embedding weight (also when tied to an output layer), and
    any name listed by an optional `model.no_weight_decay()` (e.g. a ViT's pos_embed, cls_token).

    With `lr_decay` < 1 (layer-wise learning-rate decay, Howard & Ruder 2018; Clark et al. 2020)
    each pair is split again by depth, from `model.layer_depths()` (parameter name -> k, 0 at
    the output): a group at depth k carries ``lr_scale`` = lr_decay^k, which the engine
    multiplies into the scheduled lr (lr_k = lr · lr_decay^k).
    """
    skip = _no_decay(model)
    depths = layer_depths(model) if lr_decay < 1.0 else {}
    buckets: dict[tuple[int, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():  # shared (tied) tensors are yielded once
        if p.requires_grad and id(p) not in exclude:
            if depths and name not in depths:  # no depth is guessed: the model must say
                raise ValueError(f"{type(model).__name__}.layer_depths() lacks {name!r}")
            buckets.setdefault((depths.get(name, 0), id(p) in skip), []).append(p)
    groups = []
    for (depth, no_decay), params in sorted(buckets.items()):
        group = {"params": params, "weight_decay": 0.0 if no_decay else weight_decay}
        if lr_decay < 1.0:
            group["lr_scale"] = lr_decay**depth
        groups.append(group)
    return groups


def layer_depths(model: nn.Module) -> dict[str, int]:
    """`model.layer_depths()`, refused for a model without one (lr_decay cannot guess which
    layer is deeper): a run checks it before its folder is published."""
    if not hasattr(model, "layer_depths"):
        raise UserError(
            f"lr_decay needs a model that lists its layers' depths (layer_depths); "
            f"{type(model).__name__} does not: leave lr_decay at 1"
        )
    return model.layer_depths()


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    lr_decay: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over `param_groups(model, weight_decay, lr_decay=...)`
    (each group at lr · its ``lr_scale``), torch's fused kernel where every parameter allows it
    (`fused_ok`)."""
    groups = param_groups(model, weight_decay, lr_decay=lr_decay)
    if not groups:
        raise ValueError("model has no trainable parameters (all have requires_grad=False)")
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused_ok(params) or None)


def fused_ok(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, on the CPU or a CUDA
    device. On the CPU torch's default is a Python loop over the tensors; the fused kernel is
    one pass per tensor (over the MoE LM's 4.5M parameters: 22.7 -> 3.9 ms a step, one thread,
    docs/results/adamw_fused.md), the same update up to float rounding
    (tests/train/test_optim.py)."""
    return all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in params)


def output_head(model: nn.Module) -> nn.Linear | None:
    """The layer that produces the outputs: the last trainable nn.Linear in `model.modules()`
    order (every attnlab model registers its head last: GPT.head, Classifier/ViT/CNN.head,
    Seq2Seq.out_proj)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad]
    return linears[-1] if linears else None


def muon_params(model: nn.Module) -> list[nn.Parameter]:
    """The hidden weight matrices Muon updates: trainable, exactly 2-D, not the weight of any
    nn.Embedding (a head tied to the embedding included) and not the output head's weight.
    Everything else (embeddings, the head, norm gains, biases, >2-D tensors) goes to AdamW."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = output_head(model)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    return [
        p
        for p in model.parameters()
        if p.requires_grad and p.ndim == 2 and id(p) not in embeddings | head_ids
    ]


def build_muon_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    muon_lr: float,
    muon_momentum: float = 0.95,
    muon_nesterov: bool = True,
    muon_ns_steps: int = 5,
    muon_weight_decay: float = 0.0,
    muon_ns_dtype: str = "float32",
) -> MuonAdamW:
    """MuonAdamW: one Muon group over `muon_params(model)` (Jordan's "original" lr scaling,
    the quintic coefficients) and AdamW groups (`param_groups`, lr, betas) over the rest."""
    hidden = muon_params(model)
    muon_group = {
        "params": hidden,
        "use_muon": True,
        "lr": muon_lr,
        "weight_decay": muon_weight_decay,
        "momentum": muon_momentum,
        "nesterov": muon_nesterov,
        "ns_coefficients": NS_COEFFICIENTS,
        "eps": NS_EPS,
        "ns_steps": muon_ns_steps,
        "adjust_lr_fn": "original",
        "ns_dtype": muon_ns_dtype,
    }
    adam_groups = [
        {**g, "use_muon": False, "lr": lr, "betas": tuple(betas), "eps": ADAM_EPS}
        for g in param_groups(model, weight_decay, exclude={id(p) for p in hidden})
    ]
    groups = ([muon_group] if hidden else []) + adam_groups
    if not groups:
        raise ValueError("model has no trainable parameters (all have requires_grad=False)")
    return MuonAdamW(groups)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` names, with the TrainConfig's hyper-parameters."""
    if cfg.optimizer == "adamw":
        return build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.betas, cfg.lr_decay)
    return build_muon_optimizer(
        model,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        betas=cfg.betas,
        muon_lr=cfg.muon_lr,
        muon_momentum=cfg.muon_momentum,
        muon_nesterov=cfg.muon_nesterov,
        muon_ns_steps=cfg.muon_ns_steps,
        muon_weight_decay=cfg.muon_weight_decay,
        muon_ns_dtype=cfg.muon_ns_dtype,
    )


def describe_groups(optimizer: torch.optim.Optimizer) -> str:
    """One line: how many tensors and parameters each kind of group updates."""
    counts: dict[str, list[int]] = {}
    for group in optimizer.param_groups:
        kind = "Muon" if group.get("use_muon") else "AdamW"
        tensors, numel = counts.setdefault(kind, [0, 0])
        counts[kind] = [
            tensors + len(group["params"]),
            numel + sum(p.numel() for p in group["params"]),
        ]
    return "optimizer: " + "; ".join(
        f"{kind} {n} tensors ({numel:,} parameters)" for kind, (n, numel) in counts.items()
    )
