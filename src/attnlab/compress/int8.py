"""int8 quantisation of linear layers: per-output-channel symmetric int8 weights, optional
per-token dynamic int8 activations.

Weights (the scheme of ``torch.ao.quantization``'s ``PerChannelMinMaxObserver`` with
``qint8`` and ``per_channel_symmetric``): for output row i,

    s_i = max(max_j |W_ij| / 127.5, ε),   Q_ij = clamp(round(W_ij / s_i), −128, 127),

so |W_ij − s_i Q_ij| ≤ s_i / 2 and the weight-only output y_i = s_i (x · Q_i) + b_i differs from
the float one by at most (s_i / 2) Σ_j |x_j| (:func:`weight_only_bound`).

Activations (``activations="dynamic"``): each token's input row x is quantised on the fly,
t = max_j |x_j| / 127, x̂ = t · round(x / t), and the product is an int8 × int8 → int32 matmul
(``torch._int_mm``): y_i = t s_i (q_x · Q_i) + b_i. Its error is at most
Σ_j (|x_j| s_i / 2 + (t / 2) |s_i Q_ij|) (:func:`dynamic_bound`).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Activations = Literal["none", "dynamic"]
EPS = torch.finfo(torch.float32).eps  # the observer's smallest scale


def quantize_per_channel(w: Tensor) -> tuple[Tensor, Tensor]:
    """W (out, in) -> (Q int8 (out, in), scales float32 (out,)), symmetric per output row."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.5).clamp_min(EPS)  # (out,)
    inverse = 1.0 / scale[:, None]  # (out, 1) multiplied, not divided, as torch.ao rounds
    q = torch.clamp(torch.round(w * inverse), -128, 127).to(torch.int8)  # (out, in)
    return q, scale


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, in) float32 -> (int8 (N, in), scales (N, 1)), symmetric per row, 127 levels each
    side. No clamp is needed: |x_j| ≤ max_j |x_j| = 127 t up to one rounding of t (or < 127 t
    when t is raised to ε), far from the 127.5 that would round to 128. Five passes over x, one
    float temporary; no gradient (rounding has none)."""
    x = x.detach()
    magnitude = x.abs()  # (N, in); its memory is reused for x / t
    scale = magnitude.amax(dim=-1, keepdim=True).div_(127.0).clamp_min_(EPS)  # (N, 1)
    return torch.div(x, scale, out=magnitude).round_().to(torch.int8), scale


class Int8Linear(nn.Module):
    """A Linear whose weight is stored as int8 with one float scale per output channel."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dynamic: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer(
            "weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8)
        )
        self.register_buffer("weight_scale", torch.ones(out_features))
        # 8 = dynamic int8 activations, 0 = float activations; kept in the file, so a loaded
        # model knows its scheme
        self.register_buffer(
            "activation_bits", torch.tensor(8 if dynamic else 0, dtype=torch.uint8)
        )
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, activations: Activations = "none") -> Int8Linear:
        out = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            activations == "dynamic",
        )
        q, scale = quantize_per_channel(linear.weight)
        out.weight_int8.copy_(q)
        out.weight_scale.copy_(scale)
        if linear.bias is not None:
            out.bias.data.copy_(linear.bias.detach())
        return out.to(linear.weight.device)

    @property
    def dynamic(self) -> bool:
        return int(self.activation_bits) == 8

    @property
    def weight(self) -> Tensor:
        """The dequantised weight (out, in), for code that reads ``.weight`` directly."""
        return self.weight_int8.float() * self.weight_scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        if self.dynamic:
            flat = x.reshape(-1, self.in_features).float()  # (N, in)
            xq, xs = quantize_per_token(flat)  # (N, in) int8, (N, 1)
            y = rescale(int8_matmul(xq, self.weight_int8), xs, self.weight_scale, self.bias)
            return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)  # (…, out)
        # torch._weight_int8pack_mm would skip the conversion, but on CPU (torch 2.13) it is
        # tens of times slower than this for float32 inputs (its fast path is bfloat16 only)
        y = F.linear(x, self.weight_int8.to(x.dtype))  # (…, out), float accumulation
        return scale_and_shift(y, self.weight_scale.to(y.dtype), self.bias)

    def extra_repr(self) -> str:
        acts = "int8 dynamic" if self.dynamic else "float"
        return f"{self.in_features}, {self.out_features}, int8 weights, {acts} activations"


def int8_matmul(xq: Tensor, q: Tensor) -> Tensor:
    """int8 (N, in) · int8 (out, in)ᵀ -> int32 (N, out), exact (|sum| < 2³¹ for in < 2¹⁷)."""
    if q.shape[1] == 1:  # torch's CPU _int_mm is wrong for an inner size of 1
        return xq.int() * q.int().t()  # (N, out), the one product per entry
    return torch._int_mm(xq, q.t())


def rescale(acc: Tensor, token_scale: Tensor, channel_scale: Tensor, bias: Tensor | None) -> Tensor:
    """int32 acc (N, out) -> float32 t_n s_i acc_ni + b_i (N, out), written over acc's memory:
    the int32 -> float32 conversion is elementwise, each entry read before it is overwritten,
    so the (N, out) result costs no new allocation (three passes; four under autograd)."""
    y = acc.view(torch.float32).copy_(acc)  # (N, out) float32, same storage
    return scale_and_shift(y.mul_(token_scale), channel_scale, bias)


def scale_and_shift(y: Tensor, channel_scale: Tensor, bias: Tensor | None) -> Tensor:
    """y (…, out) -> y s + b in place (s one scale per output channel): one pass when autograd
    need not see it, else two in-place ops it records."""
    if bias is None:
        return y.mul_(channel_scale)
    if torch.is_grad_enabled() and (y.requires_grad or bias.requires_grad):
        return y.mul_(channel_scale).add_(bias)
    return torch.addcmul(bias, y, channel_scale, out=y)


def _tied_weights(model: nn.Module) -> set[int]:
    """ids of parameters that appear under more than one name (e.g. a tied LM head)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {pid for pid, n in seen.items() if n > 1}


def quantize_model(model: nn.Module, activations: Activations = "none") -> list[str]:
    """Replace every nn.Linear of ``model`` (in place) by an Int8Linear; returns their names.

    A Linear whose weight is shared with another module (a head tied to the embedding) stays
    float: quantising it would untie it.
    """
    tied = _tied_weights(model)
    names = []
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and id(module.weight) not in tied:
            _set(model, name, Int8Linear.from_linear(module, activations))
            names.append(name)
    return names


def prepare_for_int8_weights(model: nn.Module, keys: set[str]) -> bool:
    """Swap in (empty) Int8Linear modules where ``keys`` (a weights file's names) hold int8
    weights, so the file loads into ``model``; False when the file is not quantised."""
    names = {k[: -len(".weight_int8")] for k in keys if k.endswith(".weight_int8")}
    if not names:
        return False
    modules = dict(model.named_modules())
    for name in names:
        linear = modules.get(name)
        if type(linear) is nn.Linear:
            dynamic = False  # set from the file's activation_bits when it is loaded
            _set(model, name, Int8Linear(linear.in_features, linear.out_features,
                                         linear.bias is not None, dynamic))  # fmt: skip
    return True


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def weight_only_bound(x: Tensor, layer: Int8Linear) -> Tensor:
    """Largest possible |int8 output − float output| per output, (…, out), weight-only."""
    return x.abs().sum(dim=-1, keepdim=True) * layer.weight_scale / 2


def dynamic_bound(x: Tensor, layer: Int8Linear) -> Tensor:
    """Largest possible |int8 output − float output|, (N, out), for dynamic activations."""
    x = x.reshape(-1, layer.in_features).float()  # (N, in)
    _, xs = quantize_per_token(x)  # (N, 1)
    weight_part = x.abs().sum(dim=-1, keepdim=True) * layer.weight_scale / 2  # (N, out)
    act_part = (xs / 2) * layer.weight.abs().sum(dim=1)  # (N, out)
    return weight_part + act_part


# --------------------------------------------------------------------------- int8 KV cache


def quantize_per_head_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """Keys or values (B, H, T, D) -> (int8 (B, H, T, D), scales (B, H, T, 1)): one symmetric
    scale per token and head, s = max_d |x| / 127, so |x − s·q| ≤ s / 2."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp_min(EPS)  # (B, H, T, 1)
    return torch.clamp(torch.round(x.float() / scale), -127, 127).to(torch.int8), scale


class Int8KVCache:
    """A KV cache (the interface of :class:`attnlab.layers.attention.KVCache`) that stores keys and
    values as int8 with one float32 scale per token and head: D + 4 bytes per token, head and
    tensor instead of 4·D. Attention reads the dequantised keys and values."""

    def __init__(self) -> None:
        self._k: tuple[Tensor, Tensor] | None = None  # int8 (B, H, cap, D), scales (B, H, cap, 1)
        self._v: tuple[Tensor, Tensor] | None = None
        self.length = 0
        self.static = False
        self.dtype = torch.float32

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, Hkv, Tnew, D); return all so far, dequantised."""
        self.dtype = k.dtype
        t_new = k.shape[2]
        end = self.length + t_new
        if self._k is None or end > self._k[0].shape[2]:
            capacity = max(16, 2 * end)
            self._k, self._v = self._grown(self._k, k, capacity), self._grown(self._v, v, capacity)
        for store, new in ((self._k, k), (self._v, v)):
            q, s = quantize_per_head_token(new)
            store[0][:, :, self.length : end] = q
            store[1][:, :, self.length : end] = s
        self.length = end
        return self.keys, self.values

    def _grown(self, old: tuple[Tensor, Tensor] | None, like: Tensor, capacity: int):
        B, H, _, D = like.shape
        q = torch.empty(B, H, capacity, D, dtype=torch.int8, device=like.device)
        s = torch.empty(B, H, capacity, 1, dtype=torch.float32, device=like.device)
        if old is not None:
            q[:, :, : self.length] = old[0][:, :, : self.length]
            s[:, :, : self.length] = old[1][:, :, : self.length]
        return q, s

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Cross-attention keys/values, quantised once."""
        self.length = 0
        self._k = self._v = None
        self.append(k, v)
        self.static = True

    def _read(self, store: tuple[Tensor, Tensor] | None) -> Tensor:
        assert store is not None, "empty Int8KVCache"
        q, s = store[0][:, :, : self.length], store[1][:, :, : self.length]
        return (q.float() * s).to(self.dtype)  # (B, H, T, D)

    @property
    def keys(self) -> Tensor:
        return self._read(self._k)

    @property
    def values(self) -> Tensor:
        return self._read(self._v)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self._k is not None and self._v is not None:
            self._k = tuple(t.index_select(0, index) for t in self._k)  # type: ignore[assignment]
            self._v = tuple(t.index_select(0, index) for t in self._v)  # type: ignore[assignment]

    def nbytes_per_token(self) -> int:
        """Bytes one token takes in this cache (keys and values, every head)."""
        if self._k is None:
            return 0
        _, H, _, D = self._k[0].shape
        return 2 * H * (D + 4)
