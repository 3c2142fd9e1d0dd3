"""Muon: orthogonalised momentum for 2-D hidden weights, and MuonAdamW (Muon + AdamW in one).

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/) replaces a matrix parameter's update by the
nearest semi-orthogonal matrix to its momentum. For weight W with gradient G_t:

    B_t = mu * B_{t-1} + (1 - mu) * G_t                (momentum as an EMA, B_0 = 0)
    M_t = (1 - mu) * G_t + mu * B_t  if nesterov else B_t
    O_t = NS_k(M_t) ~ U V^T  where M_t = U S V^T     (k Newton-Schulz steps, below)
    W  <- W * (1 - lr * weight_decay) - lr * s(W) * O_t

with s(W) = sqrt(max(1, rows / cols)) ("original", Jordan's scaling), 0.2 * sqrt(max(rows,
cols)) ("match_rms_adamw", Liu et al. 2025, "Muon is Scalable for LLM Training", sec. 2.2).
These are the semantics and keyword names of `torch.optim.Muon` (its code, whose momentum is the
EMA above; its docstring writes the un-damped B_t = mu B_{t-1} + G_t).

The Newton-Schulz map (Jordan et al. 2024; Bernstein & Newhouse 2024) normalises
X_0 = M / max(||M||_F, eps), works on the wide orientation (rows <= cols, so X X^T is the
smaller Gram matrix), and iterates the quintic

    A = X X^T,   X <- a X + (b A + c A^2) X,   (a, b, c) = (3.4445, -4.7750, 2.0315),

whose coefficients maximise the slope at 0 so that 5 steps push every singular value of X into
roughly [0.7, 1.2] instead of exactly 1 (Jordan et al. 2024). `torch.optim.Muon` runs it in
bfloat16; `ns_dtype` (an addition) lets a CPU without bfloat16 matrix units run it in float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from attnlab.errors import UserError

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024, quintic iteration
NS_EPS = 1e-7
ADJUST_LR_FNS = ("original", "match_rms_adamw")
MUON_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps")
ADAMW_KEYS = ("lr", "weight_decay", "betas", "eps")
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def newton_schulz(
    m: Tensor,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    steps: int = 5,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Approximate orthogonalisation U V^T of a matrix M = U S V^T (module docstring), in `dtype`.

    m: (R, C) -> (R, C). Raises ValueError for a non-matrix or a bad coefficient triple.
    """
    if m.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalises matrices, got shape {tuple(m.shape)}")
    if len(coefficients) != 3:
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {coefficients}")
    if not 0 <= steps < 100:
        raise ValueError(f"ns_steps must be in [0, 100), got {steps}")
    a, b, c = coefficients
    tall = m.shape[0] > m.shape[1]
    x = m.to(dtype)  # (R, C)
    if tall:
        x = x.T  # (C, R): rows <= cols
    x = x / x.norm().clamp(min=eps)  # Frobenius norm >= spectral norm, so ||x||_2 <= 1
    for _ in range(steps):
        gram = x @ x.T  # (r, r), r = min(R, C)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2, (r, r)
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X, (r, max(R, C))
    return x.T if tall else x  # (R, C)


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The per-matrix step size lr * s(W) of the module docstring (None = "original")."""
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn must be one of {', '.join(ADJUST_LR_FNS)} or None")


@torch.no_grad()
def muon_group_step(group: dict[str, Any], state: dict[Tensor, dict[str, Any]]) -> None:
    """One Muon update of every parameter with a gradient in `group` (module docstring)."""
    lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
    dtype = NS_DTYPES[group.get("ns_dtype", "bfloat16")]
    for p in group["params"]:
        if p.grad is None:
            continue
        grad = p.grad
        if grad.is_sparse or torch.is_complex(p):
            raise ValueError("Muon needs dense real-valued matrix gradients")
        pstate = state[p]
        if "momentum_buffer" not in pstate:
            pstate["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        buf = pstate["momentum_buffer"]  # (R, C)
        buf.lerp_(grad, 1 - mu)  # B = mu B + (1 - mu) G
        update = grad.lerp(buf, mu) if group["nesterov"] else buf  # (R, C)
        ortho = newton_schulz(
            update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
        )
        p.mul_(1 - lr * wd)  # decoupled weight decay, with the unadjusted lr (as torch does)
        p.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


@torch.no_grad()
def adamw_group_step(group: dict[str, Any], state: dict[Tensor, dict[str, Any]]) -> None:
    """One AdamW update (Loshchilov & Hutter 2019, Algorithm 2; Kingma & Ba 2015 bias
    correction) of every parameter with a gradient in `group`, as `torch.optim.AdamW` computes it:

        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  p <- p (1 - lr wd)
        p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    beta1, beta2 = group["betas"]
    for p in group["params"]:
        if p.grad is None:
            continue
        grad = p.grad
        if grad.is_sparse:
            raise ValueError("AdamW here needs dense gradients")
        pstate = state[p]
        if "step" not in pstate:
            pstate["step"] = 0
            pstate["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            pstate["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        pstate["step"] += 1
        step, exp_avg, exp_avg_sq = pstate["step"], pstate["exp_avg"], pstate["exp_avg_sq"]
        p.mul_(1 - lr * wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))


def _check_muon_hyper(group: dict[str, Any]) -> None:
    """ValueError for a Muon group whose hyper-parameters or parameters it cannot use."""
    for key in ("lr", "momentum", "weight_decay"):
        if not group[key] >= 0:
            raise UserError(f"Muon {key} must be >= 0, got {group[key]}")
    adjust = group["adjust_lr_fn"]
    if adjust is not None and adjust not in ADJUST_LR_FNS:
        raise UserError(f"adjust_lr_fn must be one of {', '.join(ADJUST_LR_FNS)} or None")
    if not 0 <= group["ns_steps"] < 100:
        raise UserError(f"ns_steps must be in [0, 100), got {group['ns_steps']}")
    if group.get("ns_dtype", "bfloat16") not in NS_DTYPES:
        raise UserError(
            f"ns_dtype must be one of {', '.join(NS_DTYPES)}, got {group['ns_dtype']!r}"
        )
    for p in group["params"]:
        if p.ndim != 2:
            raise UserError(
                f"Muon updates 2-D matrices only, got a parameter of shape {tuple(p.shape)}; "
                "give it to AdamW"
            )


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters, with `torch.optim.Muon`'s keywords and defaults, plus
    `ns_dtype` ("bfloat16" as torch, "float32", "float64"): the dtype of the Newton-Schulz
    iteration, a name (not a torch.dtype) so that checkpoints store it as JSON."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = NS_EPS,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        ns_dtype: str = "bfloat16",
    ) -> None:
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(ns_coefficients),
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_muon_hyper(group)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every group; `closure` re-evaluates the loss as in torch.optim."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            muon_group_step(group, self.state)
        return loss


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer whose groups are either Muon (`use_muon=True`) or AdamW (`use_muon=False`).

    Every group carries all its hyper-parameters: Muon groups the keys of `Muon` (`MUON_KEYS`,
    `adjust_lr_fn`, optional `ns_dtype`), AdamW groups `ADAMW_KEYS`. One object, so the engine's
    lr schedule, gradient clipping, GradScaler and checkpoints treat it like any optimizer; its
    state_dict holds Muon's momentum buffers and AdamW's moments and step counts.
    """

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        for group in groups:
            if "use_muon" not in group:
                raise ValueError("every MuonAdamW group needs use_muon=True or False")
            keys = MUON_KEYS + ("adjust_lr_fn",) if group["use_muon"] else ADAMW_KEYS
            missing = [k for k in keys if k not in group]
            if missing:
                kind = "Muon" if group["use_muon"] else "AdamW"
                raise ValueError(f"MuonAdamW: a {kind} group lacks {', '.join(missing)}")
        super().__init__(groups, {})
        for group in self.param_groups:
            if group["use_muon"]:
                _check_muon_hyper(group)
            elif len(group["betas"]) != 2 or not all(0 <= b < 1 for b in group["betas"]):
                raise ValueError(f"AdamW betas must be two numbers in [0, 1), got {group['betas']}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Muon on the Muon groups, AdamW on the others."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (muon_group_step if group["use_muon"] else adamw_group_step)(group, self.state)
        return loss
