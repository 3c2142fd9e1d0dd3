"""Transformer building blocks: norms, feed-forward, blocks and their stacks.

:class:`Block` (self-attention + feed-forward) is the layer of every encoder (bidirectional)
and of every decoder-only model (``is_causal=True``); :class:`BlockStack` stacks them.
:class:`DecoderBlock` adds cross-attention for encoder-decoder models; :class:`Decoder` stacks
those. Every block takes (B, T, D) and returns (B, T, D) plus the attention weights when asked
(``need_weights``), and is built from one :class:`BlockConfig`.
Post-norm (the original Transformer): x = Norm(x + Sublayer(x)).
Pre-norm (GPT-2, LLaMA):               x = x + Sublayer(Norm(x)), with a final norm on the stack.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend, KVCache, MultiHeadAttention, RotaryHook
from attnlab.layers.dropout import Dropout
from attnlab.layers.efficient import (
    BACKEND_HELP,
    AttentionKind,
    check_attention_config,
    make_kernel,
)

NormKind = Literal["layer", "rms", "dyt"]
NormPosition = Literal["pre", "post"]
Activation = Literal["relu", "gelu", "gelu_tanh", "swiglu", "relu2", "geglu", "geglu_tanh"]
GATED: tuple[Activation, ...] = ("swiglu", "geglu", "geglu_tanh")  # w_in holds gate and up rows


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + eps) · g  (Zhang & Sennrich 2019, eq. 4); no centring."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32 at least, as LLaMA does, then return to the input's dtype.
        dtype = x.dtype
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., D)
        return self.weight * h.to(dtype)


DYT_ALPHA0 = 0.5  # Zhu et al. 2025: α's start for every non-LLM model in the paper


def check_dyt_alpha0(norm: str, alpha0: float) -> None:
    """A start for DyT's α only means something with ``norm = "dyt"``: refuse it otherwise."""
    if norm != "dyt" and alpha0 != DYT_ALPHA0:
        raise UserError(
            f"dyt_alpha0={alpha0} only applies to norm='dyt', but norm={norm!r}; drop it or set "
            "norm='dyt'"
        )


class DyT(nn.Module):
    """Dynamic Tanh, DyT(x) = γ ⊙ tanh(α·x) + β  (Zhu et al. 2025, "Transformers without
    Normalization", eq. 1): a drop-in for LayerNorm with no statistics over the channels.

    α is one learned scalar, initialised to ``alpha0`` (the paper's default 0.5); γ starts at
    ones and β at zeros, as LayerNorm's affine parameters do.
    """

    def __init__(self, d_model: int, alpha0: float = DYT_ALPHA0, bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha0)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.weight * torch.tanh(self.alpha * x)  # (..., D)
        return h if self.bias is None else h + self.bias


def make_norm(
    kind: NormKind,
    d_model: int,
    eps: float = 1e-5,
    bias: bool = True,
    alpha0: float = DYT_ALPHA0,
) -> nn.Module:
    """LayerNorm (Ba et al. 2016: (x − μ)/σ · g + b, PyTorch's kernel), RMSNorm or DyT (which
    has no eps: it divides by nothing; ``alpha0`` starts its α)."""
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    if kind == "dyt":
        return DyT(d_model, alpha0, bias=bias)
    raise ValueError(f"norm must be one of {', '.join(get_args(NormKind))}, got {kind!r}")


def apply_activation(h: Tensor, activation: Activation) -> Tensor:
    """The hidden activation of a feed-forward layer (or of one MoE expert): h (..., W) ->
    (..., W), or (..., W/2) for the gated ones, whose first half gates the second: swiglu
    SiLU(g) ⊙ u; geglu GELU(g) ⊙ u, geglu_tanh with tanh-GELU (T5 v1.1's gated-gelu)."""
    if activation in GATED:
        gate, up = h.chunk(2, dim=-1)
        if activation == "swiglu":
            return F.silu(gate) * up
        return F.gelu(gate, approximate="tanh" if activation == "geglu_tanh" else "none") * up
    if activation == "relu":
        return F.relu(h)
    if activation == "relu2":
        return F.relu(h).square()
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    raise ValueError(
        f"activation must be one of {', '.join(get_args(Activation))}, got {activation!r}"
    )


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W2 · act(W1 x + b1) + b2 (Vaswani et al. 2017, eq. 2).

    With ``swiglu``: W2 · (SiLU(W_gate x) ⊙ W_up x)  (Shazeer 2020, eq. 6); the gate and up
    projections are stored as one matrix ``w_in`` (gate rows first) for one matmul.
    ``relu2`` is squared ReLU, act(h) = max(h, 0)²  (So et al. 2021, Primer, §3).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: Activation = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in get_args(Activation):
            raise ValueError(
                f"activation must be one of {', '.join(get_args(Activation))}, got {activation!r}"
            )
        self.activation = activation
        width = 2 * d_ff if activation in GATED else d_ff
        self.w_in = nn.Linear(d_model, width, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = apply_activation(self.w_in(x), self.activation)  # (B, T, d_ff)
        return self.w_out(self.dropout(h))  # (B, T, D)


def check_heads(d_model: int, n_heads: int) -> None:
    """Refuse a width the heads do not split evenly (every config's rule, one message)."""
    if d_model % n_heads:
        raise UserError(f"d_model={d_model} is not divisible by n_heads={n_heads}")


@dataclass
class BlockConfig(ConfigBase):
    """Everything a Transformer block is built from; every model makes one and passes it."""

    d_model: int = setting(512, "width of the residual stream", min=1)
    n_heads: int = setting(8, "attention heads (d_model a multiple of it)", min=1)
    d_ff: int = setting(2048, "feed-forward width", min=1)
    n_kv_heads: int = setting(0, "0 = n_heads; fewer = grouped-query attention", min=0)
    activation: Activation = setting("relu", "feed-forward activation")
    norm: NormKind = setting("layer", "layer | rms | dyt (Dynamic Tanh, no statistics)")
    norm_position: NormPosition = setting("post", "where the norm sits around each sub-layer")
    norm_eps: float = setting(1e-5, "epsilon of every norm", min=0.0)
    dyt_alpha0: float = setting(DYT_ALPHA0, "DyT's initial α (norm = dyt only)", above=0.0)
    dropout: float = setting(0.1, "dropout on sub-layer outputs", min=0.0, below=1.0)
    attn_dropout: float | None = setting(
        None, "dropout on the attention weights (None = dropout)", min=0.0, below=1.0
    )
    ffn_dropout: float | None = setting(
        None,
        "dropout inside the feed-forward layer, after its activation (None = dropout; "
        "BERT's family has none there)",
        min=0.0,
        below=1.0,
    )
    bias: bool = setting(True, "biases in linear layers and norms")
    attention: AttentionKind = setting(
        "full", "what: full | local (sliding window) | linear (elu+1); how: --backend"
    )
    window: int = setting(
        0, 'attention="local": keys within this distance of a query, itself included', min=0
    )
    n_global: int = setting(
        0, 'attention="local": leading tokens that see and are seen by all', min=0
    )
    backend: Backend = setting("fused", BACKEND_HELP)
    qk_norm: bool = setting(False, "RMSNorm on each head's queries and keys before RoPE")
    value_embeddings: bool = setting(
        False, "a second token table added (gated per layer) to the attention values"
    )

    def check(self) -> None:
        check_heads(self.d_model, self.n_heads)
        if self.n_heads % self.kv_heads:
            raise UserError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        check_attention_config(self.attention, self.window, self.n_global, self.backend)
        check_dyt_alpha0(self.norm, self.dyt_alpha0)

    @property
    def kv_heads(self) -> int:
        """Key/value heads (n_heads unless grouped-query attention)."""
        return self.n_kv_heads or self.n_heads

    def self_attention(self, rotary: RotaryHook | None) -> MultiHeadAttention:
        """The block's self-attention layer (full attention by ``backend``, local or linear).

        ``qk_norm``: queries and keys of each head go through RMSNorm over the head dimension
        before RoPE (QK-norm, Dehghani et al. 2023, §3.1; as Qwen3 and OLMo 2 do per head).
        """
        head_dim = self.d_model // self.n_heads
        qk = [RMSNorm(head_dim, self.norm_eps) for _ in range(2)] if self.qk_norm else [None] * 2
        return MultiHeadAttention(
            self.d_model,
            self.n_heads,
            self.kv_heads,
            bias=self.bias,
            dropout=self.dropout if self.attn_dropout is None else self.attn_dropout,
            rotary=rotary,
            backend=self.backend,
            kernel=make_kernel(self.attention, self.window, self.n_global),
            q_norm=qk[0],
            k_norm=qk[1],
        )

    def feed_forward(self) -> FeedForward:
        inner = self.dropout if self.ffn_dropout is None else self.ffn_dropout
        return FeedForward(self.d_model, self.d_ff, self.activation, inner, self.bias)

    def make_norm(self) -> nn.Module:
        return make_norm(self.norm, self.d_model, self.norm_eps, self.bias, self.dyt_alpha0)


def block_setting(name: str, default: Any = dataclasses.MISSING, **bounds: float) -> Any:
    """A model config's field that its blocks read (``BlockConfig.name``): the --help text and
    range declared once on BlockConfig, the model's own default (else BlockConfig's);
    ``bounds`` narrow the range."""
    field = BlockConfig.__dataclass_fields__[name]
    ranges = {k: field.metadata[k] for k in ("min", "max", "above", "below") if k in field.metadata}
    default = field.default if default is dataclasses.MISSING else default
    return setting(default, field.metadata.get("help", ""), **(ranges | bounds))


class Block(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual and a norm.

    Bidirectional it is an encoder layer (BERT, ViT); with ``is_causal=True`` it is the
    GPT/LLaMA decoder-only block.
    ``attention`` chooses full, local (sliding ``window``, ``n_global`` global tokens) or
    linear self-attention (:mod:`attnlab.layers.efficient`), ``backend`` how full attention is
    computed (explicit, fused, matmul, flash, triton); the parameters are the same for all of them.
    With ``value_embeddings`` the block has a learned gate λ (init 0.5) and its self-attention
    values become v = x W_v + λ · e for the ``values`` e given to forward (modded-nanogpt mixes
    λ₀ v + λ₁ e; λ₀ folds into W_v).

    Other sublayers can be given: ``mixer`` replaces self-attention by another causal sequence
    mixer, called as ``mixer(h, cache)`` with its own cache (``mixer.new_cache()``), e.g. a Mamba
    block (Jamba's layers: Lieber et al. 2024); ``ff`` replaces the feed-forward layer, e.g. a
    mixture of experts; ``feed_forward=False`` leaves it out (Mamba's layers: the mixer alone).
    The residual wiring and the norms stay the same.
    """

    def __init__(
        self,
        cfg: BlockConfig,
        rotary: RotaryHook | None = None,
        *,
        mixer: nn.Module | None = None,
        ff: nn.Module | None = None,
        feed_forward: bool = True,
    ) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.self_attn = cfg.self_attention(rotary) if mixer is None else None
        self.mixer = mixer
        self.ff = (cfg.feed_forward() if ff is None else ff) if feed_forward else None
        self.norm1 = cfg.make_norm()
        self.norm2 = cfg.make_norm() if feed_forward else None
        self.dropout1 = Dropout(cfg.dropout)
        self.dropout2 = Dropout(cfg.dropout)
        gated = cfg.value_embeddings and mixer is None  # only attention reads value embeddings
        self.value_gate = nn.Parameter(torch.tensor(0.5)) if gated else None

    def new_cache(self) -> Any:
        """An empty decoding cache of this block's mixer (KV cache, window, linear or SSM state)."""
        if self.mixer is not None:
            return self.mixer.new_cache()
        return self.self_attn.new_cache()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        bias: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D); mask: bool (B|1, 1|H, T, T) True = may attend. Returns x, weights.

        values: (B, T, Hkv·Dh) value embeddings of the tokens, for a block built with
        ``value_embeddings`` (ignored by one without)."""

        def attend(h: Tensor) -> tuple[Tensor, Tensor | None]:
            if self.mixer is not None:  # a mixer has no attention weights
                return self.dropout1(self.mixer(h, cache)), None
            extra = None
            if self.value_gate is not None and values is not None:
                extra = self.value_gate * values  # (B, T, Hkv·Dh)
            out, w = self.self_attn(
                h,
                mask=mask,
                is_causal=is_causal,
                bias=bias,
                need_weights=need_weights,
                cache=cache,
                values=extra,
            )
            return self.dropout1(out), w

        if self.cfg.norm_position == "pre":
            a, weights = attend(self.norm1(x))
            x = x + a  # (B, T, D)
            if self.ff is not None:
                x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            a, weights = attend(x)
            x = self.norm1(x + a)
            if self.ff is not None:
                x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention over the encoder output, feed-forward.

    ``attention``/``window``/``n_global`` choose the self-attention kernel as in Block;
    cross-attention is always full (every target position may read the whole source).
    """

    def __init__(
        self,
        cfg: BlockConfig,
        rotary: RotaryHook | None = None,
        d_memory: int | None = None,
    ) -> None:
        """``d_memory``: width of the encoder output read by cross-attention (default d_model)."""
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.self_attn = cfg.self_attention(rotary)
        self.cross_attn = MultiHeadAttention(
            cfg.d_model,
            cfg.n_heads,
            cfg.kv_heads,
            kdim=d_memory,
            vdim=d_memory,
            bias=cfg.bias,
            dropout=cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout,
            backend=cfg.backend,
        )
        self.ff = cfg.feed_forward()
        self.norm1 = cfg.make_norm()
        self.norm2 = cfg.make_norm()
        self.norm3 = cfg.make_norm()
        self.dropout1 = Dropout(cfg.dropout)
        self.dropout2 = Dropout(cfg.dropout)
        self.dropout3 = Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        is_causal: bool = True,
        bias: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        """x: (B, Tq, D); memory: (B, Tk, Dm). Returns x and (self weights, cross weights)."""

        def self_block(h: Tensor) -> tuple[Tensor, Tensor | None]:
            out, w = self.self_attn(
                h,
                mask=self_mask,
                is_causal=is_causal,
                bias=bias,
                need_weights=need_weights,
                cache=cache,
            )
            return self.dropout1(out), w

        def cross_block(h: Tensor) -> tuple[Tensor, Tensor | None]:
            out, w = self.cross_attn(
                h, memory, mask=memory_mask, need_weights=need_weights, cache=cross_cache
            )
            return self.dropout2(out), w

        if self.cfg.norm_position == "pre":
            a, w_self = self_block(self.norm1(x))
            x = x + a
            c, w_cross = cross_block(self.norm2(x))
            x = x + c
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:
            a, w_self = self_block(x)
            x = self.norm1(x + a)
            c, w_cross = cross_block(x)
            x = self.norm2(x + c)
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x, (w_self, w_cross)


class BlockStack(nn.Module):
    """A stack of Blocks with an optional final norm (needed after pre-norm blocks): an
    encoder, or the body of a decoder-only model.

    ``gradient_checkpointing = True`` recomputes each block's activations in the backward
    pass instead of storing them: less memory, about one extra forward of compute.
    """

    def __init__(self, blocks: list[Block], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.norm = final_norm
        self.gradient_checkpointing = False

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        bias: Tensor | None = None,
        need_weights: bool = False,
        caches: list[KVCache] | None = None,
        values: Tensor | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """x: (B, T, D) -> (B, T, D); with ``need_weights`` also a list of (B, H, T, T).

        ``values`` (value embeddings, (B, T, Hkv·Dh)) go to every block. Only blocks ``start``
        to ``stop`` - 1 run (``x`` being the output of the block below ``start``); the final
        norm only when the stack runs to its top."""
        stop = len(self.blocks) if stop is None else stop
        weights: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            if not start <= i < stop:
                continue
            cache = None if caches is None else caches[i]
            # Not with a cache: the recomputation in the backward pass would append twice.
            if (
                self.gradient_checkpointing
                and self.training
                and torch.is_grad_enabled()
                and cache is None
            ):
                x, w = checkpoint(
                    block,
                    x,
                    mask,
                    is_causal=is_causal,
                    bias=bias,
                    need_weights=need_weights,
                    cache=cache,
                    values=values,
                    use_reentrant=False,
                )
            else:
                x, w = block(
                    x,
                    mask,
                    is_causal=is_causal,
                    bias=bias,
                    need_weights=need_weights,
                    cache=cache,
                    values=values,
                )
            if w is not None:
                weights.append(w)
        if self.norm is not None and stop == len(self.blocks):
            x = self.norm(x)
        return (x, weights) if need_weights else x


class Decoder(nn.Module):
    """A stack of DecoderBlocks (self + cross attention) with an optional final norm."""

    def __init__(self, blocks: list[DecoderBlock], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.norm = final_norm
        self.gradient_checkpointing = False

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        is_causal: bool = True,
        bias: Tensor | None = None,
        need_weights: bool = False,
        caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
    ) -> Tensor | tuple[Tensor, list[tuple[Tensor | None, Tensor | None]]]:
        """x: (B, Tq, D), memory: (B, Tk, Dm) -> (B, Tq, D) [, per-layer (self, cross) weights].

        ``bias`` (1|B, H, Tq, Tk): an additive self-attention score bias given to every block
        (T5's relative positions, computed once and shared by the layers)."""
        weights: list[tuple[Tensor | None, Tensor | None]] = []
        for i, block in enumerate(self.blocks):
            kwargs = dict(
                is_causal=is_causal,
                bias=bias,
                need_weights=need_weights,
                cache=None if caches is None else caches[i],
                cross_cache=None if cross_caches is None else cross_caches[i],
            )
            # Not with caches: the recomputation in the backward pass would append twice.
            if (
                self.gradient_checkpointing
                and self.training
                and torch.is_grad_enabled()
                and kwargs["cache"] is None
                and kwargs["cross_cache"] is None
            ):
                x, w = checkpoint(
                    block, x, memory, self_mask, memory_mask, use_reentrant=False, **kwargs
                )
            else:
                x, w = block(x, memory, self_mask, memory_mask, **kwargs)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if need_weights else x
