"""Attention-head pruning (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than
One?"), for any model built from :class:`attnlab.layers.attention.MultiHeadAttention` layers.

* **head mask** ξ (one gate per head, :func:`head_mask`): each head's output is multiplied by
  ξ_h before the output projection, through a pre-hook on ``out_proj`` (attention itself is
  untouched); ξ = 1 is the model, ξ_h = 0 removes head h;
* **importance** (eq. 2): I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1, summed over batches, then
  normalised per layer by its L2 norm (§4.2) (:func:`head_importance`);
* **physical removal** (:func:`prune_heads`): the least important heads are cut out of the
  q/k/v rows and the out_proj columns, leaving a smaller MultiHeadAttention (fewer parameters
  and FLOPs, not zeros); its outputs equal the masked model's. At least one head stays in every
  layer. The kept head counts go into the model config (``heads_per_layer``), and
  :func:`apply_head_counts` rebuilds layers of those sizes when a pruned run is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.attention import MultiHeadAttention


def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """The model's self-attention layers, in module order (one per encoder block)."""
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def check_prunable(layers: list[MultiHeadAttention]) -> None:
    """Refuse layers whose heads cannot be cut out alone (shared key/value heads)."""
    if not layers:
        raise UserError("the model has no attention layers to prune")
    for i, layer in enumerate(layers):
        if layer.n_kv_heads != layer.n_heads:
            raise UserError(
                f"attention layer {i} shares key/value heads (grouped-query); heads cannot be "
                "pruned one by one there"
            )


@contextmanager
def head_mask(model: nn.Module, mask: Tensor) -> Iterator[Tensor]:
    """While active, head h of attention layer l is scaled by ``mask[l, h]`` (L, H_max)."""
    layers = attention_layers(model)
    hooks = []
    for i, layer in enumerate(layers):
        gate = mask[i, : layer.n_heads]  # (H,)

        def scale(module: nn.Module, args: Any, gate: Tensor = gate, dh: int = layer.head_dim):
            x = args[0]  # (B, T, H*Dh): the heads' outputs side by side
            return (x * gate.repeat_interleave(dh).to(x.dtype),)

        hooks.append(layer.out_proj.register_forward_pre_hook(scale))
    try:
        yield mask
    finally:
        for hook in hooks:
            hook.remove()


def head_importance(
    model: nn.Module, batches: Iterable[Any], loss_fn: Callable[[nn.Module, Any], Tensor]
) -> Tensor:
    """I (L, H_max): Σ_batches |∂L/∂ξ| at ξ = 1, each layer's row divided by its L2 norm;
    entries past a layer's head count are +inf (nothing to prune there)."""
    layers = attention_layers(model)
    check_prunable(layers)
    H = max(layer.n_heads for layer in layers)
    mask = torch.ones(len(layers), H, requires_grad=True)
    total = torch.zeros(len(layers), H)
    was_training = model.training
    model.eval()  # dropout off: the gradient of the model that will be used
    with head_mask(model, mask):
        for batch in batches:
            (grad,) = torch.autograd.grad(loss_fn(model, batch), mask)
            total += grad.abs()
    model.train(was_training)
    total = total / total.norm(dim=1, keepdim=True).clamp(min=1e-20)
    for i, layer in enumerate(layers):
        total[i, layer.n_heads :] = float("inf")
    return total


def heads_to_remove(importance: Tensor, n: int) -> list[list[int]]:
    """The ``n`` least important heads over all layers, keeping at least one per layer."""
    L = importance.shape[0]
    counts = torch.isfinite(importance).sum(dim=1).tolist()
    available = sum(c - 1 for c in counts)
    if not 0 <= n <= available:
        raise UserError(
            f"can remove 0..{available} heads (every layer keeps one of its {counts}), got {n}"
        )
    order = sorted(
        ((float(importance[i, h]), i, h) for i in range(L) for h in range(counts[i])),
    )
    remove: list[list[int]] = [[] for _ in range(L)]
    left = list(counts)
    for _, i, h in order:
        if sum(len(r) for r in remove) == n:
            break
        if left[i] > 1:
            remove[i].append(h)
            left[i] -= 1
    return [sorted(r) for r in remove]


def smaller_attention(layer: MultiHeadAttention, n_heads: int) -> MultiHeadAttention:
    """A MultiHeadAttention like ``layer`` (same width, head size, hooks) with ``n_heads``."""
    has_bias = layer.out_proj.bias is not None
    return MultiHeadAttention(
        layer.d_model,
        n_heads,
        head_dim=layer.head_dim,
        bias=has_bias,
        dropout=layer.dropout,
        rotary=layer.rotary,
        backend=layer.backend,
        kernel=layer.kernel,
        q_norm=layer.q_norm,
        k_norm=layer.k_norm,
    ).to(layer.out_proj.weight.device, layer.out_proj.weight.dtype)


@torch.no_grad()
def cut_heads(layer: MultiHeadAttention, remove: list[int]) -> MultiHeadAttention:
    """``layer`` without the heads ``remove``: their rows of q_proj and kv_proj (keys and
    values) and their out_proj columns dropped."""
    H, dh = layer.n_heads, layer.head_dim
    keep = [h for h in range(H) if h not in set(remove)]
    small = smaller_attention(layer, len(keep))
    cols = torch.cat([torch.arange(h * dh, (h + 1) * dh) for h in keep])  # (H'·Dh,)
    kv_rows = torch.cat([cols, cols + H * dh])  # keys, then values (kv_proj's row order)
    for name, rows in (("q_proj", cols), ("kv_proj", kv_rows)):
        big, new = getattr(layer, name), getattr(small, name)
        new.weight.copy_(big.weight[rows])
        if big.bias is not None:
            new.bias.copy_(big.bias[rows])
    small.out_proj.weight.copy_(layer.out_proj.weight[:, cols])
    if layer.out_proj.bias is not None:
        small.out_proj.bias.copy_(layer.out_proj.bias)
    return small


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)


def prune_heads(model: nn.Module, remove: list[list[int]]) -> list[int]:
    """Physically remove heads ``remove[l]`` from attention layer l; -> kept heads per layer."""
    layers = attention_layers(model)
    check_prunable(layers)
    if len(remove) != len(layers):
        raise ValueError(f"{len(remove)} lists of heads for {len(layers)} attention layers")
    for layer, heads in zip(layers, remove):
        if heads:
            _replace(model, layer, cut_heads(layer, heads))
    return [layer.n_heads for layer in attention_layers(model)]


def apply_head_counts(model: nn.Module, counts: tuple[int, ...]) -> None:
    """Rebuild the attention layers with ``counts`` heads each (one per attention layer; empty =
    leave as is), as a pruned run was saved; the weights are loaded afterwards."""
    if not counts:
        return
    layers = attention_layers(model)
    if len(counts) != len(layers) or min(counts) < 1:
        raise UserError(
            f"heads_per_layer={list(counts)} must list {len(layers)} counts of at least 1"
        )
    for layer, n in zip(layers, counts):
        if n > layer.n_heads:
            raise UserError(f"heads_per_layer asks for {n} heads in a layer of {layer.n_heads}")
        if n != layer.n_heads:
            _replace(model, layer, smaller_attention(layer, n))
