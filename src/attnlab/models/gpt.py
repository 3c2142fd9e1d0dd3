"""GPT: a decoder-only Transformer language model built from attnlab's core blocks.

tokens -> embedding (+ learned positions) -> N pre-norm causal blocks -> final norm -> logits.
Positions are learned absolute vectors (GPT-2), rotary (RoPE, LLaMA) or linear attention biases
(ALiBi); norms LayerNorm or RMSNorm; the feed-forward GELU or SwiGLU; ``n_kv_heads`` < ``n_heads``
gives grouped-query attention. With ``tie_weights`` the output projection is the token
embedding matrix (Press & Wolf 2017). Attention runs through PyTorch's fused causal kernel,
or, with ``attention = "local"`` or ``"linear"``, through :mod:`attnlab.efficient` (sliding
window of ``window`` keys and ``n_global`` global tokens, or elu+1 linear attention); each
kind decodes with its own cache (:meth:`GPT.new_caches`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from attnlab.blocks import Encoder, EncoderBlock, make_norm
from attnlab.efficient import check_attention_config
from attnlab.positions import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding

POSITIONS = ("learned", "rope", "alibi")
NORMS = ("layer", "rms")
ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu")


@dataclass
class GPTConfig:
    """Everything that defines a GPT; saved in the run's config.json."""

    vocab_size: int = 0  # set from the tokenizer
    context: int = 256  # longest sequence the model attends over (block size)
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 0  # 0 = n_heads; fewer = grouped-query attention
    d_model: int = 384
    d_ff: int = 0  # 0 = 4·d_model (GELU) or LLaMA's 2/3·4·d_model rounded to 64 (SwiGLU)
    pos: str = "learned"  # learned | rope | alibi
    norm: str = "layer"  # layer | rms
    activation: str = "gelu_tanh"  # gelu | gelu_tanh | swiglu
    bias: bool = True  # biases in linear layers and LayerNorm
    tie_weights: bool = True  # output projection = token embedding
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    gradient_checkpointing: bool = False
    attention: str = "full"  # full | local (sliding window) | linear (elu+1 feature map)
    window: int = 0  # attention="local": keys each query sees, itself included
    n_global: int = 0  # attention="local": leading positions every query sees

    def validate(self) -> None:
        """Raise ValueError naming the field and what to change."""
        if self.vocab_size <= 0:
            raise ValueError("vocab_size must be set (build the tokenizer first)")
        check_attention_config(self.attention, self.window, self.n_global)
        if self.attention == "linear" and self.pos == "alibi":
            raise ValueError(
                "pos='alibi' adds a bias to attention scores, which linear attention does not "
                "form; use pos='learned' or 'rope' with attention='linear'"
            )
        for name, value, choices in (
            ("pos", self.pos, POSITIONS),
            ("norm", self.norm, NORMS),
            ("activation", self.activation, ACTIVATIONS),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        for name in ("context", "n_layers", "n_heads", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; change one"
            )
        if self.n_heads % self.kv_heads != 0:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.pos == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("pos='rope' needs an even head size d_model / n_heads")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ff_width(self) -> int:
        """Hidden width of the feed-forward layer."""
        if self.d_ff:
            return self.d_ff
        if self.activation == "swiglu":  # same parameter count as a 4·d GELU MLP
            return 64 * math.ceil(8 * self.d_model / 3 / 64)
        return 4 * self.d_model


class GPT(nn.Module):
    """Decoder-only Transformer LM: ids (B, T) -> next-token logits (B, T, vocab)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, D)
        self.pos_emb = LearnedPositionalEmbedding(cfg.context, D) if cfg.pos == "learned" else None
        rotary = RotaryEmbedding(D // cfg.n_heads, cfg.rope_base) if cfg.pos == "rope" else None
        self.alibi = ALiBi(cfg.n_heads) if cfg.pos == "alibi" else None
        self.drop = nn.Dropout(cfg.dropout)
        blocks = [
            EncoderBlock(
                D,
                cfg.n_heads,
                cfg.ff_width,
                dropout=cfg.dropout,
                activation=cfg.activation,  # type: ignore[arg-type]
                norm_first=True,
                norm=cfg.norm,  # type: ignore[arg-type]
                norm_eps=cfg.norm_eps,
                bias=cfg.bias,
                n_kv_heads=cfg.kv_heads,
                rotary=rotary,
                attention=cfg.attention,
                window=cfg.window,
                n_global=cfg.n_global,
            )
            for _ in range(cfg.n_layers)
        ]
        final_norm = make_norm(cfg.norm, D, cfg.norm_eps, cfg.bias)  # type: ignore[arg-type]
        self.stack = Encoder(blocks, final_norm)
        self.stack.gradient_checkpointing = cfg.gradient_checkpointing
        self.head = nn.Linear(D, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual outputs scaled by 1/√(2L)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.stack.blocks:
            for proj in (block.self_attn.out_proj, block.ff.w_out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layers))

    def new_caches(self) -> list[Any]:
        """One empty decoding cache per layer, for `forward(..., caches=...)`: a KVCache for
        full attention, a SlidingWindowCache (local) or a LinearAttentionState (linear)."""
        return [block.self_attn.new_cache() for block in self.stack.blocks]

    def forward(
        self, ids: Tensor, caches: list[Any] | None = None, last_only: bool = False
    ) -> Tensor:
        """ids (B, T) -> logits (B, T, V), or (B, 1, V) with ``last_only``.

        With ``caches`` the ids continue the sequence held there: their positions start at
        the cache length, and their keys and values are appended for the next call.
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        T = ids.shape[1]
        past = caches[0].length if caches is not None else 0
        if past + T > self.cfg.context:
            raise ValueError(
                f"{past + T} positions exceed the model's context of {self.cfg.context}; "
                "crop the input to the last context tokens"
            )
        x = self.tok_emb(ids)  # (B, T, D)
        if self.pos_emb is not None:
            x = self.pos_emb(x, past)  # (B, T, D)
        x = self.drop(x)
        bias = None if self.alibi is None else self.alibi(T, past + T)  # (1, H, T, past + T)
        x = self.stack(x, is_causal=True, bias=bias, caches=caches)  # (B, T, D)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return self.head(x)  # (B, T, V)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; without the position table by default (as nanoGPT counts for MFU)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos_emb is not None:
            n -= self.pos_emb.embedding.weight.numel()
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs per token, 6N + 12·L·d·T (Kaplan et al. 2020; PaLM appendix B)."""
        cfg = self.cfg
        return 6 * self.num_params() + 12 * cfg.n_layers * cfg.d_model * cfg.context
