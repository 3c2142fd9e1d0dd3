"""Sparse mixture-of-experts feed-forward (Shazeer et al. 2017; Switch, Fedus et al. 2021;
Mixtral, Jiang et al. 2024).

A router (linear, no bias) scores each token against E experts; the token goes to its top-k
experts, whose outputs are summed with the router probabilities renormalised over those k
(Mixtral eq. in §2.1: y = Σ_{i ∈ top-k} softmax(top-k logits)_i · E_i(x)). Each expert is a
feed-forward network: SwiGLU as in Mixtral, W2 (SiLU(W1 x) ⊙ W3 x), or GELU.

Tokens are dispatched by sorting the (token, expert) assignments by expert and gathering all
rows in that order with one index_select, split into the experts' blocks; the outputs come back
with one index_add (a loop over the experts, none over tokens).

Auxiliary losses, computed on every forward and kept on the module (:attr:`MoEFeedForward.stats`):
- load balance (Switch Transformer eq. 4-6): E · Σ_i f_i P_i, f_i the share of tokens routed to
  expert i (top-k assignments / tokens, so Σ f_i = k) and P_i the mean router probability of
  expert i; k when perfectly balanced. This is Hugging Face's ``load_balancing_loss_func``.
- router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): mean over tokens of logsumexp(logits)²,
  which keeps router logits small.
Capacity (Switch §2.2): with ``capacity_factor`` > 0 an expert takes at most
⌈capacity_factor · tokens · k / E⌉ assignments; first choices are served before second
choices, earlier tokens before later ones, and the rest are dropped (they add nothing; the
residual connection carries the token on). Dropped assignments are counted in the stats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.blocks import Activation, apply_activation

EXPERT_ACTIVATIONS: tuple[str, ...] = get_args(Activation)  # those of a dense FeedForward


def router_probs(router_logits: Tensor) -> Tensor:
    """Softmax over experts, in float32 at least: (N, E) -> (N, E)."""
    dtype = torch.promote_types(router_logits.dtype, torch.float32)
    return torch.softmax(router_logits.to(dtype), dim=-1)


def load_balancing_loss(
    router_logits: Tensor, top_k: int, mask: Tensor | None = None, chosen: Tensor | None = None
) -> Tensor:
    """Switch Transformer's balance loss (eq. 4-6) for top-k routing: E · Σ_i f_i P_i.

    router_logits (N, E); mask (N,) with 1 for tokens that count (padding excluded) or None.
    f_i = (number of top-k assignments to expert i) / tokens, P_i = mean probability of i.
    For several layers, concatenate their logits along N (as Hugging Face's function does).
    """
    E = router_logits.shape[-1]
    probs = router_probs(router_logits)  # (N, E)
    if chosen is None:  # the router's top-k choices (N, k), if the caller has not made them
        chosen = probs.topk(top_k, dim=-1).indices  # (N, k)
    weight = probs.new_ones(probs.shape[0]) if mask is None else mask.reshape(-1).to(probs)
    counts = torch.zeros(E, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, chosen.reshape(-1), weight.repeat_interleave(top_k))  # (E,)
    tokens = weight.sum()
    f = counts / tokens  # (E,)
    P = (probs * weight[:, None]).sum(dim=0) / tokens  # (E,)
    return E * (f * P).sum()


def router_z_loss(router_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): mean_tokens logsumexp(logits)²."""
    dtype = torch.promote_types(router_logits.dtype, torch.float32)
    z = torch.logsumexp(router_logits.to(dtype), dim=-1) ** 2  # (N,)
    if mask is None:
        return z.mean()
    weight = mask.reshape(-1).to(z)  # (N,)
    return (z * weight).sum() / weight.sum()


@dataclass
class MoEStats:
    """What one forward of a MoE layer measured."""

    balance_loss: Tensor  # scalar, Switch eq. 4 (k at perfect balance)
    z_loss: Tensor  # scalar, ST-MoE eq. 5
    usage: Tensor  # (E,) share of the kept top-k assignments that went to each expert
    dropped: float  # share of top-k assignments dropped by the capacity limit
    router_logits: Tensor  # (N, E)


class MoEFeedForward(nn.Module):
    """Top-k routed mixture of expert FFNs: x (B, T, d_model) -> (B, T, d_model).

    Expert weights are stored stacked: ``w_in`` (E, 2·d_ff, d_model) for SwiGLU (gate rows
    first, then up) or (E, d_ff, d_model) for GELU; ``w_out`` (E, d_model, d_ff). The router is
    ``router`` (d_model -> E, no bias). After each forward, :attr:`stats` holds the losses and
    usage, and :attr:`aux_loss` is aux_weight · balance + z_weight · z.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        experts: int = 8,
        top_k: int = 2,
        activation: str = "swiglu",
        capacity_factor: float = 0.0,
        aux_weight: float = 0.01,
        z_weight: float = 0.0,
    ) -> None:
        super().__init__()
        check_moe_config(experts, top_k, capacity_factor, aux_weight, z_weight)
        if activation not in EXPERT_ACTIVATIONS:
            raise ValueError(
                f"MoE expert activation must be one of {', '.join(EXPERT_ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        self.experts = experts
        self.top_k = top_k
        self.activation = activation
        self.capacity_factor = capacity_factor
        self.aux_weight = aux_weight
        self.z_weight = z_weight
        width_in = 2 * d_ff if activation == "swiglu" else d_ff
        self.router = nn.Linear(d_model, experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(experts, width_in, d_model))
        self.w_out = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.stats: MoEStats | None = None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        """N(0, std) router and input weights, N(0, out_std or std) output weights (the
        sublayer interface the GPT initialises through)."""
        nn.init.normal_(self.router.weight, std=std)
        nn.init.normal_(self.w_in, std=std)
        nn.init.normal_(self.w_out, std=std if out_std is None else out_std)

    def capacity(self, tokens: int) -> int:
        """Assignments each expert may take: ⌈capacity_factor · tokens · k / E⌉ (0 = no limit)."""
        if self.capacity_factor <= 0:
            return 0
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def expert(
        self, e: int, x: Tensor, w_in: Tensor | None = None, w_out: Tensor | None = None
    ) -> Tensor:
        """Expert e's FFN on its rows x (n, d_model) -> (n, d_model). ``forward`` hands over
        the expert's weights from one ``unbind`` of the stacks: the backward of ``w_in[e]``
        would write a zero-filled copy of the whole (E, ·, ·) stack per expert."""
        w_in = self.w_in[e] if w_in is None else w_in
        w_out = self.w_out[e] if w_out is None else w_out
        h = apply_activation(F.linear(x, w_in), self.activation)  # (n, F)
        return F.linear(h, w_out)  # (n, D)

    def route(self, x2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router on tokens (N, D): logits (N, E), top-k weights renormalised (N, k), experts
        (N, k)."""
        logits = self.router(x2)  # (N, E)
        weights, chosen = router_probs(logits).topk(self.top_k, dim=-1)  # (N, k) each
        weights = weights / weights.sum(dim=-1, keepdim=True)  # (N, k)
        return logits, weights, chosen

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``mask`` (B, T), 1 for real tokens: padding is still
        routed but left out of the losses and usage."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (N, D)
        N, E, k = x2.shape[0], self.experts, self.top_k
        logits, weights, chosen = self.route(x2)
        # Assignments in priority order: all first choices (by token), then second choices, ...
        expert_of = chosen.t().reshape(-1)  # (k·N,)
        token_of = torch.arange(N, device=x.device).repeat(k)  # (k·N,)
        weight_of = weights.t().reshape(-1)  # (k·N,)
        order = torch.argsort(expert_of, stable=True)  # (k·N,) grouped by expert
        expert_sorted = expert_of[order]  # (k·N,)
        counts = torch.bincount(expert_of, minlength=E)  # (E,)
        cap = self.capacity(N)
        if cap:
            starts = torch.cumsum(counts, 0) - counts  # (E,) first slot of each expert
            rank = torch.arange(k * N, device=x.device) - starts[expert_sorted]  # (k·N,)
            kept = rank < cap
            counts = counts.clamp(max=cap)
            order, expert_sorted = order[kept], expert_sorted[kept]  # (M,) kept assignments
        tokens = token_of[order]  # (M,)
        w_in, w_out = self.w_in.unbind(0), self.w_out.unbind(0)  # E views; backward: 1 stack
        rows = x2.index_select(0, tokens).split(counts.tolist())  # E blocks (n_e, D), 1 gather
        outs = [self.expert(e, r, w_in[e], w_out[e]) for e, r in enumerate(rows) if r.numel()]
        y = torch.cat(outs, dim=0) if outs else x2[:0]  # (M, D)
        y = y * weight_of[order, None].to(y.dtype)  # (M, D)
        # y is in the experts' compute dtype (bf16 under autocast, while x may be float32)
        out = y.new_zeros(x2.shape).index_add_(0, tokens, y)  # (N, D)
        self._record(logits, expert_sorted, tokens, mask, chosen)
        return out.reshape(shape)

    @torch.no_grad()
    def _usage(
        self, kept_experts: Tensor, kept_tokens: Tensor, n_tokens: int, mask: Tensor | None
    ) -> tuple[Tensor, float]:
        """Share of kept assignments per expert (E,) and share dropped, real tokens only."""
        real = torch.ones(n_tokens, device=kept_tokens.device)  # (N,)
        if mask is not None:
            real = mask.reshape(-1).to(real)
        w = real[kept_tokens]  # (M,)
        usage = torch.bincount(kept_experts, weights=w, minlength=self.experts)  # (E,)
        assigned = real.sum() * self.top_k
        return usage / usage.sum().clamp(min=1), float(1 - w.sum() / assigned.clamp(min=1))

    def _record(
        self,
        logits: Tensor,
        kept_experts: Tensor,
        kept_tokens: Tensor,
        mask: Tensor | None,
        chosen: Tensor,
    ) -> None:
        usage, dropped = self._usage(kept_experts, kept_tokens, logits.shape[0], mask)
        self.stats = MoEStats(
            balance_loss=load_balancing_loss(logits, self.top_k, mask, chosen),
            z_loss=router_z_loss(logits, mask),
            usage=usage,
            dropped=dropped,
            router_logits=logits,
        )

    @property
    def aux_loss(self) -> Tensor:
        """aux_weight · balance loss + z_weight · z-loss of the last forward (a scalar)."""
        if self.stats is None:
            raise ValueError("aux_loss is defined after a forward pass of the MoE layer")
        return self.aux_weight * self.stats.balance_loss + self.z_weight * self.stats.z_loss

    def num_active_params(self) -> int:
        """Parameters one token uses: router + k experts."""
        per_expert = (self.w_in.numel() + self.w_out.numel()) // self.experts
        return self.router.weight.numel() + self.top_k * per_expert


def check_moe_config(
    experts: int, top_k: int, capacity_factor: float, aux_weight: float, z_weight: float
) -> None:
    """Raise ValueError naming the field to change."""
    if experts < 1:
        raise UserError(f"experts must be >= 1, got {experts}")
    if not 1 <= top_k <= experts:
        raise UserError(f"top_k must be in [1, experts={experts}], got {top_k}")
    if capacity_factor < 0:
        raise UserError(f"capacity_factor must be >= 0 (0 = no limit), got {capacity_factor}")
    for name, value in (("moe_aux_weight", aux_weight), ("moe_z_weight", z_weight)):
        if value < 0:
            raise UserError(f"{name} must be >= 0, got {value}")
