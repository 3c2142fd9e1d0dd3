"""GPT: a decoder-only Transformer language model built from attnlab's core blocks.

tokens -> embedding (+ learned positions) -> N pre-norm causal blocks -> final norm -> logits.
Positions are learned absolute vectors (GPT-2), rotary (RoPE, LLaMA) or linear attention biases
(ALiBi); norms LayerNorm or RMSNorm; the feed-forward GELU or SwiGLU; ``n_kv_heads`` < ``n_heads``
gives grouped-query attention. With ``tie_weights`` the output projection is the token
embedding matrix (Press & Wolf 2017). Attention runs through PyTorch's fused causal kernel,
or, with ``attention = "local"`` or ``"linear"``, through :mod:`attnlab.layers.efficient` (sliding
window of ``window`` keys and ``n_global`` global tokens, or elu+1 linear attention); each
kind decodes with its own cache (:meth:`GPT.new_caches`).

More positions (docs/positions.md): fixed sinusoids (Vaswani 2017), T5's bucketed relative bias
(one-sided, causal) or none at all (``pos = "none"``, NoPE: the causal mask alone carries
order); RoPE can be stretched at inference by ``rope_factor`` (``rope_scaling`` linear =
position interpolation, or ntk). The learned table has ``context`` rows: the model refuses
inputs past it, and weights with a learned table do not load into a model built with a larger
context (no vector exists for those positions). With sinusoids the token embeddings are
multiplied by √d_model (Vaswani et al. 2017, §3.4): at GPT-2's N(0, 0.02) init the unit-amplitude
sinusoids would otherwise swamp them. ``norm = "dyt"`` is Dynamic Tanh.

Speedrun switches (modded-nanogpt; each off by default, so the ablation can turn it off):
``qk_norm`` (RMSNorm of each head's queries and keys before RoPE), ``activation = "relu2"``
(squared ReLU, Primer), ``value_embeddings`` (a second token table whose rows are added, gated
per layer, to the attention values), ``zero_init_proj`` (the attention and MLP output
projections start at zero, so every block starts as the identity) and ``logit_softcap`` c
(logits = c · tanh(logits / c), Gemma 2); an untied head is ``tie_weights = false``.

Mixer and feed-forward: ``mixer = "mamba"`` replaces self-attention in every layer by a Mamba
block (:mod:`attnlab.layers.ssm`), ``"hybrid"`` in every layer except attn_every, 2·attn_every, ...
(1-based), which keep attention (Jamba, Lieber et al. 2024, interleaves the same way); every
layer keeps its feed-forward sublayer. Settings of attention (pos rope/alibi, qk_norm,
value_embeddings, the attention kernel) act on the attention layers only, so ``--mixer mamba``
works on any preset (learned positions are still added to the embeddings). ``ffn = "moe"``
makes that sublayer a top-k mixture of ``experts`` (:mod:`attnlab.layers.moe`); the load-balancing
and router z-losses of the last forward are :meth:`GPT.aux_loss`, the routing shares
:meth:`GPT.expert_usage`. ``mixer = "rwkv"`` makes every layer an RWKV-4 layer
(:mod:`attnlab.layers.rwkv`): the time-mix replaces attention and, with ``ffn = "dense"``, RWKV's
channel-mix is the feed-forward (``moe`` puts experts there instead). ``ffn = "none"`` leaves
the feed-forward sublayer out (Gu & Dao's Mamba LM: the mixer alone in each layer). Decoding
keeps a KV cache for each attention layer and the recurrent state of each Mamba or RWKV layer.

Each sublayer initialises itself: after the GPT-2 pass over every Linear and Embedding, a mixer
or feed-forward with an ``init_weights(std, out_std)`` method (Mamba, RWKV's time-mix and
channel-mix, the mixture of experts) is handed the GPT-2 standard deviations and sets its own
structure (Mamba's A, D and Δ; RWKV's decays and token-shift mixes); the core attention and MLP
get their residual output projection scaled by 1/√(2L).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.configs import ConfigBase, project, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend
from attnlab.layers.blocks import (
    Activation,
    Block,
    BlockConfig,
    BlockStack,
    NormKind,
    block_setting,
)
from attnlab.layers.efficient import AttentionKind
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.positions import LearnedPositionalEmbedding, RopeScaling, make_positions
from attnlab.layers.rwkv import ChannelMix, RwkvBlock, TimeMix
from attnlab.layers.ssm import MambaBlock
from attnlab.models.registry import register_model, tokens

EMB_STD = 0.02  # GPT-2's init of every Linear and Embedding weight


@dataclass
class GPTConfig(ConfigBase):
    """Everything that defines a GPT; saved in the run's config.json."""

    vocab_size: int = setting(0, min=1, unset=0, set_by="the tokenizer")
    context: int = setting(256, "longest sequence the model attends over (block size)", min=1)
    n_layers: int = setting(6, min=1)
    n_heads: int = block_setting("n_heads", 6)
    n_kv_heads: int = block_setting("n_kv_heads", 0)
    d_model: int = block_setting("d_model", 384)
    d_ff: int = setting(
        0, "0 = 4·d_model, or LLaMA's 2/3·4·d_model rounded to 64 with swiglu", min=0
    )
    pos: Literal["learned", "rope", "alibi", "sinusoidal", "t5", "none"] = setting(
        "learned", "positions: learned table, rope, alibi, sinusoidal, t5 bias, none (NoPE)"
    )
    norm: NormKind = block_setting("norm", "layer")
    dyt_alpha0: float = block_setting("dyt_alpha0")
    activation: Activation = block_setting("activation", "gelu_tanh")
    bias: bool = block_setting("bias", True)
    tie_weights: bool = setting(True, "output projection = token embedding")
    dropout: float = block_setting("dropout", 0.0)
    norm_eps: float = block_setting("norm_eps", 1e-5)
    rope_base: float = setting(10000.0, min=1.0)
    rope_scaling: RopeScaling = setting(
        "none", "inference-time RoPE stretch: linear (position interpolation) or ntk"
    )
    rope_factor: float = setting(1.0, "RoPE stretch factor s (context · s)", min=1.0)
    gradient_checkpointing: bool = setting(False)
    attention: AttentionKind = block_setting("attention", "full")
    window: int = block_setting("window", 0)
    n_global: int = block_setting("n_global", 0)
    backend: Backend = block_setting("backend", "fused")
    qk_norm: bool = block_setting("qk_norm", False)
    value_embeddings: bool = block_setting("value_embeddings", False)
    zero_init_proj: bool = setting(False, "attention and MLP output projections start at zero")
    logit_softcap: float = setting(0.0, "0 = off; else logits = c·tanh(logits / c)", min=0.0)
    mixer: Literal["attention", "mamba", "hybrid", "rwkv"] = setting(
        "attention",
        "sequence mixer of each layer: attention, Mamba, both interleaved, or RWKV's time-mix",
    )
    attn_every: int = setting(
        2, "hybrid: layers attn_every, 2·attn_every, ... (1-based) are attention", min=1
    )
    d_state: int = setting(16, "Mamba: state size N per channel", min=1)
    d_conv: int = setting(4, "Mamba: width of the causal depthwise convolution", min=1)
    expand: int = setting(2, "Mamba: inner width = expand · d_model", min=1)
    dt_rank: int = setting(
        0, "Mamba: rank of the step-size projection; 0 = ceil(d_model/16)", min=0
    )
    ffn: Literal["dense", "moe", "none"] = setting(
        "dense",
        "feed-forward: one MLP (RWKV's channel-mix with mixer rwkv), a mixture of experts, or none",
    )
    experts: int = setting(8, "MoE: experts per layer", min=1)
    top_k: int = setting(2, "MoE: experts per token", min=1)
    moe_aux_weight: float = setting(0.01, "MoE: load-balancing loss weight", min=0.0)
    moe_z_weight: float = setting(0.0, "MoE: router z-loss weight", min=0.0)
    capacity_factor: float = setting(
        0.0, "MoE: expert capacity = factor · tokens · top_k / experts; 0 = no limit", min=0.0
    )

    def check(self) -> None:
        if self.ffn == "moe" and self.top_k > self.experts:
            raise UserError(f"top_k={self.top_k} exceeds experts={self.experts}; lower top_k")
        if self.mixer == "hybrid" and self.attn_every > self.n_layers:
            raise UserError(
                f"mixer='hybrid' with attn_every={self.attn_every} > n_layers={self.n_layers} "
                "has no attention layer; lower attn_every or use mixer='mamba'"
            )
        if self.attention == "linear" and self.pos in ("alibi", "t5"):
            raise UserError(
                f"pos={self.pos!r} adds a bias to attention scores, which linear attention does "
                "not form; use pos='learned', 'sinusoidal' or 'rope' with attention='linear'"
            )
        if self.pos == "rope" and (self.d_model // self.n_heads) % 2:
            raise UserError("pos='rope' needs an even head size d_model / n_heads")
        self.block_config()  # head counts, attention kernel

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

    def layer_mixers(self) -> list[str]:
        """The sequence mixer of each layer, "attention", "mamba" or "rwkv"."""
        if self.mixer == "hybrid":
            return [
                "attention" if (i + 1) % self.attn_every == 0 else "mamba"
                for i in range(self.n_layers)
            ]
        return [self.mixer] * self.n_layers

    def block_config(self) -> BlockConfig:
        """The pre-norm causal block every layer is built from."""
        return project(self, BlockConfig, d_ff=self.ff_width, norm_position="pre")


class GPT(nn.Module):
    """Decoder-only Transformer LM: ids (B, T) -> next-token logits (B, T, vocab)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        D = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, D)
        # DyT divides by nothing, so its inputs must start near unit scale: a learned gain on the
        # token embeddings starting at 1 / 0.02 (their init std). The DyT authors' LLaMA does the
        # same: a learned scalar starting at √d on embeddings initialised with std 1/√d.
        self.emb_gain = nn.Parameter(torch.tensor(EMB_STD**-1)) if cfg.norm == "dyt" else None
        positions = make_positions(
            cfg.pos,
            D,
            cfg.n_heads,
            cfg.context,
            rope_base=cfg.rope_base,
            rope_scaling=cfg.rope_scaling,
            rope_factor=cfg.rope_factor,
            causal=True,
        )
        self.pos_emb = positions.absolute  # learned or sinusoidal table, or None
        self.rel_bias = positions.bias  # ALiBi or T5 bias, or None
        self.drop = nn.Dropout(cfg.dropout)
        block = cfg.block_config()
        blocks = [
            self._layer(block, kind, positions.rotary, i)
            for i, kind in enumerate(cfg.layer_mixers())
        ]
        self.stack = BlockStack(blocks, block.make_norm())
        self.stack.gradient_checkpointing = cfg.gradient_checkpointing
        self.value_emb = None  # (V, Hkv·Dh): the values each token adds in every layer
        if cfg.value_embeddings and "attention" in cfg.layer_mixers():
            self.value_emb = nn.Embedding(cfg.vocab_size, cfg.kv_heads * (D // cfg.n_heads))
        self.head = nn.Linear(D, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight

    def _layer(
        self, block: BlockConfig, kind: str, rotary: nn.Module | None, i: int
    ) -> Block | RwkvBlock:
        """Layer i: attention, Mamba or RWKV, then a dense, mixture-of-experts or no
        feed-forward."""
        cfg = self.cfg
        mixer = None
        if kind == "mamba":
            mixer = MambaBlock(
                cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand, cfg.dt_rank, bias=cfg.bias
            )
            mixer.view_heads = cfg.n_heads  # its hidden attention is shown as n_heads groups
        ff = None
        if kind == "rwkv":
            if cfg.ffn == "dense":
                ff = ChannelMix(cfg.d_model, cfg.ff_width, i, cfg.n_layers)
            elif cfg.ffn == "moe":
                ff = self._moe()
            time_mix = TimeMix(cfg.d_model, i, cfg.n_layers)
            time_mix.view_heads = cfg.n_heads  # its weights are shown as n_heads channel groups
            return RwkvBlock(time_mix, ff, block.make_norm, i == 0)
        if cfg.ffn == "moe":
            ff = self._moe()
        return Block(block, rotary, mixer=mixer, ff=ff, feed_forward=cfg.ffn != "none")

    def _moe(self) -> MoEFeedForward:
        """One mixture-of-experts feed-forward of this config."""
        cfg = self.cfg
        return MoEFeedForward(
            cfg.d_model,
            cfg.ff_width,
            cfg.experts,
            cfg.top_k,
            cfg.activation,
            cfg.capacity_factor,
            cfg.moe_aux_weight,
            cfg.moe_z_weight,
        )

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual outputs scaled by 1/√(2L);
        with ``zero_init_proj`` those output projections are zero (modded-nanogpt). A sublayer
        with ``init_weights(std, out_std)`` (Mamba, RWKV, MoE) then initialises itself."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=EMB_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        out_std = 0.0 if self.cfg.zero_init_proj else 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for block in self.stack.blocks:
            mixer = block.mixer if block.mixer is not None else block.self_attn
            for sub, output in ((mixer, "out_proj"), (block.ff, "w_out")):
                if sub is None:
                    continue
                if hasattr(sub, "init_weights"):
                    sub.init_weights(std=0.02, out_std=out_std)
                else:  # the core attention and MLP: their residual output projection
                    getattr(sub, output).weight.normal_(0.0, 1.0).mul_(out_std)

    def new_caches(self) -> list[Any]:
        """One empty decoding cache per layer, for `forward(..., caches=...)`: a KVCache for
        full attention, a SlidingWindowCache (local), a LinearAttentionState (linear), a
        MambaCache (convolution inputs and SSM state) for a Mamba layer, or an RwkvCache
        (token shifts and wkv state) for an RWKV layer."""
        return [block.new_cache() for block in self.stack.blocks]

    def moe_layers(self) -> list[tuple[int, MoEFeedForward]]:
        """(layer index, MoE feed-forward) of every mixture-of-experts layer."""
        return [
            (i, block.ff)
            for i, block in enumerate(self.stack.blocks)
            if isinstance(block.ff, MoEFeedForward)
        ]

    def aux_loss(self) -> Tensor:
        """The MoE auxiliary loss of the last forward, a scalar to add to the LM loss:
        moe_aux_weight · load balance + moe_z_weight · router z-loss, averaged over the MoE
        layers (so the weights mean the same at any depth); 0 for a dense model."""
        layers = self.moe_layers()
        if not layers:
            return self.tok_emb.weight.new_zeros(())
        return torch.stack([ff.aux_loss for _, ff in layers]).mean()

    def expert_usage(self) -> list[dict[str, Any]]:
        """Routing of the last forward, per MoE layer: ``layer`` (index), ``usage`` (share of
        the kept top-k assignments that went to each expert, sums to 1) and ``dropped`` (share
        of assignments over capacity); [] for a dense model."""
        out = []
        for i, ff in self.moe_layers():
            if ff.stats is None:
                raise ValueError("expert_usage() is defined after a forward pass")
            out.append({"layer": i, "usage": ff.stats.usage.tolist(), "dropped": ff.stats.dropped})
        return out

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
        if self.emb_gain is not None:  # DyT: unit-scale inputs
            x = x * self.emb_gain
        elif self.cfg.pos == "sinusoidal":  # Vaswani §3.4: embeddings · √d beside unit sinusoids
            x = x * math.sqrt(self.cfg.d_model)
        if self.pos_emb is not None:
            x = self.pos_emb(x, past)  # (B, T, D)
        x = self.drop(x)
        bias = None if self.rel_bias is None else self.rel_bias(T, past + T)  # (1, H, T, past+T)
        values = None if self.value_emb is None else self.value_emb(ids)  # (B, T, Hkv·Dh)
        x = self.stack(x, is_causal=True, bias=bias, caches=caches, values=values)  # (B, T, D)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        logits = self.head(x)  # (B, T, V)
        if self.cfg.logit_softcap > 0:  # Gemma 2: c · tanh(z / c), smooth and bounded by c
            c = self.cfg.logit_softcap
            logits = c * torch.tanh(logits / c)
        return logits

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; without the position table by default (as nanoGPT counts for MFU)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.pos_emb, LearnedPositionalEmbedding):
            n -= self.pos_emb.embedding.weight.numel()
        if non_embedding and self.value_emb is not None:  # a lookup, like the position table
            n -= self.value_emb.weight.numel()
        return n

    def active_params(self) -> int:
        """Parameters one token uses: :meth:`num_params` with each MoE layer's unchosen
        experts left out (router + top_k experts count)."""
        n = self.num_params()
        for _, ff in self.moe_layers():
            n += ff.num_active_params() - sum(p.numel() for p in ff.parameters())
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs per token, 6N + 12·L·d·T (Kaplan et al. 2020; PaLM appendix B), with
        N the active parameters and L the attention layers (a Mamba layer's scan is linear in
        T and small beside its projections, which N counts)."""
        cfg = self.cfg
        n_attention = cfg.layer_mixers().count("attention")
        return 6 * self.active_params() + 12 * n_attention * cfg.d_model * cfg.context


# The registry's entries: GPT with each sequence mixer, and with a mixture-of-experts FFN.
_TINY_GPT = {"vocab_size": 48, "context": 16, "n_layers": 2, "n_heads": 2, "d_model": 32}
_GPT2_ROW = "GPT, GPT-2 layout"
_MAMBA_ROW = "Mamba GPT logits/greedy/cache (f32)"
for _name, _fields, _oracle, _also in (
    ("gpt", {}, _GPT2_ROW, ()),
    ("gpt-mamba", {"mixer": "mamba"}, _MAMBA_ROW, ()),
    ("gpt-rwkv", {"mixer": "rwkv"}, "RWKV GPT logits/greedy/cache (f32)", ()),
    ("gpt-hybrid", {"mixer": "hybrid", "attn_every": 2}, _MAMBA_ROW, (_GPT2_ROW,)),
    ("gpt-moe", {"ffn": "moe", "experts": 4}, "MoEFeedForward (f32)", (_GPT2_ROW,)),
):
    register_model(
        _name,
        family="gpt",
        config=GPTConfig,
        oracle=_oracle,
        also=_also,
        example=tokens(),
        defaults={"vocab_size": 50304, **_fields},  # GPT-2's vocabulary, padded to 64
        tiny=_TINY_GPT,
    )(GPT)
