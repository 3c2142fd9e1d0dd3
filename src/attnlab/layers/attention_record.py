"""Recording attention weights as a model runs: what the explorer's heatmaps are drawn from.

``with record_attention(model) as rec: model(x)`` leaves in ``rec.calls`` one
:class:`AttentionCall` per attention computed, in order, each labelled with the name of the
attention module in ``model`` that made it. While a recorder is active every attention call
takes the explicit path of :mod:`attnlab.layers.attention` (the only one that forms the weights) and
hands its scores and weights to :func:`record_call`; sequence mixers whose attention is implicit
(RWKV, Mamba) hand theirs to :func:`record_mixer_weights`. One recorder at a time.

A module is an attention module when its class sets ``is_attention = True``
(:class:`attnlab.layers.attention.MultiHeadAttention` does, and so do the mixers above).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class AttentionCall:
    """One attention call, as :class:`record_attention` saw it.

    ``weights = softmax(scores · scale + bias, masked)`` with ``scores`` the raw q·kᵀ (not yet
    scaled by 1/√d_k), all (B, H, Tq, Tk); ``mask`` (True = may attend) includes the causal part
    when ``is_causal``; ``module`` names the attention module that made the call.
    """

    module: str
    scores: Tensor
    scale: float
    bias: Tensor | None
    mask: Tensor | None
    is_causal: bool
    weights: Tensor


_ACTIVE: record_attention | None = None


class record_attention:  # noqa: N801 - used as a context manager, reads like a statement
    """While active, every attention call takes the explicit path and is appended to ``calls``.

    With ``model``, each call is labelled with the name of the attention module in ``model``
    that made it (``model.named_modules()`` names). One recorder at a time.
    """

    def __init__(self, model: nn.Module | None = None) -> None:
        self.model = model
        self.calls: list[AttentionCall] = []
        self._module = ""
        self._hooks: list[Any] = []

    def __enter__(self) -> record_attention:
        global _ACTIVE
        if _ACTIVE is not None:
            raise ValueError(
                "an attention recorder is already active; exit it before starting another"
            )
        for name, module in self.model.named_modules() if self.model is not None else []:
            if getattr(module, "is_attention", False):
                self._hooks.append(module.register_forward_pre_hook(self._enter_module(name)))
        _ACTIVE = self
        return self

    def _enter_module(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._module = name

        return hook

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def is_recording() -> bool:
    """Whether a :class:`record_attention` is active (attention then takes the explicit path)."""
    return _ACTIVE is not None


def record_call(
    scores: Tensor,
    scale: float,
    bias: Tensor | None,
    mask: Tensor | None,
    is_causal: bool,
    weights: Tensor,
) -> None:
    """Give the active recorder one attention call (the fields of :class:`AttentionCall`).
    No-op without a recorder."""
    if _ACTIVE is not None:
        call = AttentionCall(_ACTIVE._module, scores, scale, bias, mask, is_causal, weights)
        _ACTIVE.calls.append(call)


def record_mixer_weights(weights: Tensor) -> None:
    """Give the active recorder the attention a causal sequence mixer computes implicitly.

    weights (B, H, T, T), each row a distribution over positions <= its own (RWKV's wkv, the
    normalised hidden attention of Mamba): recorded as a causal call whose scores are the
    log-weights at scale 1, so softmax(scores) gives the weights back. No-op without a recorder.
    """
    if _ACTIVE is None:
        return
    T = weights.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=weights.device).tril()[None, None]
    scores = weights.clamp_min(torch.finfo(weights.dtype).tiny).log().masked_fill(~causal, 0.0)
    record_call(scores, 1.0, None, causal, True, weights)  # causal: (1, 1, T, T)


def channel_groups(per_channel: Tensor, groups: int) -> Tensor:
    """(B, D, T, T) per-channel weights -> (B, G, T, T), the mean over each group of D / G
    consecutive channels (G = ``groups`` when it divides D, else 1): a mixer's "heads" to show."""
    B, D, T, _ = per_channel.shape
    G = groups if groups > 0 and D % groups == 0 else 1
    return per_channel.reshape(B, G, D // G, T, T).mean(dim=2)
