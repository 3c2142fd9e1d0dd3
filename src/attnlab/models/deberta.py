"""DeBERTa-v2/v3 (He et al. 2021): attention disentangled into content and relative position.

What it changes relative to attnlab's BERT (:mod:`attnlab.models.bert`):

* **disentangled attention** (eq. 2-4): the score of query i and key j is
  q_i·k_j (content-to-content) + q_i·k^r_{δ(i,j)} (content-to-position, "c2p")
  + k_j·q^r_{δ(j,i)} (position-to-content, "p2c"), all divided by √(3 d) (eq. 4), where
  k^r, q^r are projections of a table of relative-position vectors shared by every layer
  (:class:`DisentangledSelfAttention`, ``c2p``/``p2c`` in ``forward``). The two position terms
  reach the core :func:`attnlab.layers.attention.scaled_dot_product_attention` as its additive
  ``bias``; the softmax, masking and value product are the core's;
* **relative positions** δ(i, j) = i − j clipped to ±k, and in v2/v3 mapped to
  **log-spaced buckets** beyond ``position_buckets / 2`` (:func:`log_bucket_position`);
* the relative table is LayerNormed once (``norm_rel_ebd``), and (v3, ``share_att_key``) is
  projected with the content query/key weights instead of its own;
* absolute positions are optional (``position_biased_input``; off in v3).

The layers are BERT's post-norm blocks around this attention with the core FeedForward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError
from attnlab.layers.attention import padding_mask, scaled_dot_product_attention
from attnlab.layers.blocks import BlockConfig, block_setting, check_heads
from attnlab.models.bert import BertActivation, init_bert_weights
from attnlab.models.registry import register_model, tokens


@dataclass
class DebertaConfig(ConfigBase):
    """The architecture of a DeBERTa-v2 encoder (v3: position_biased_input False,
    share_att_key True, position_buckets 256)."""

    vocab_size: int = setting(128100, min=1)
    d_model: int = block_setting("d_model", 768)
    embedding_size: int = setting(0, "width of the token embeddings; 0 = d_model", min=0)
    n_layers: int = setting(12, min=1)
    n_heads: int = block_setting("n_heads", 12)
    d_ff: int = block_setting("d_ff", 3072)
    context: int = setting(512, "absolute positions (max_position_embeddings)", min=1)
    type_vocab_size: int = setting(0, "0 = no token-type embedding", min=0)
    position_biased_input: bool = setting(False, "add absolute position embeddings (v2)")
    max_relative_positions: int = setting(0, "clip relative distances at this; 0 = context", min=0)
    position_buckets: int = setting(256, "log-bucketed relative positions; 0 = none", min=0)
    share_att_key: bool = setting(True, "project positions with the content W_q, W_k (v3)")
    pos_att: Literal["c2p+p2c", "c2p", "p2c"] = setting(
        "c2p+p2c", "which position terms the attention score has"
    )
    norm_rel_ebd: bool = setting(True, "LayerNorm the relative-position table")
    norm_eps: float = block_setting("norm_eps", 1e-7)
    dropout: float = block_setting("dropout", 0.1)
    attn_dropout: float = block_setting("attn_dropout", 0.1)
    activation: BertActivation = block_setting("activation", "gelu")
    pad_id: int = 0

    def check(self) -> None:
        check_heads(self.d_model, self.n_heads)
        if self.position_buckets and self.position_buckets < 4:
            raise UserError("position_buckets must be 0 (none) or at least 4")

    @property
    def emb(self) -> int:
        return self.embedding_size or self.d_model

    @property
    def span(self) -> int:
        """k: relative positions index a table of 2k vectors."""
        return self.position_buckets or self.max_relative_positions or self.context

    @property
    def max_position(self) -> int:
        return self.max_relative_positions or self.context

    def block_config(self) -> BlockConfig:
        return BlockConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            activation=self.activation,
            norm_eps=self.norm_eps,
            dropout=self.dropout,
            ffn_dropout=0.0,  # DebertaV2Intermediate: dense + activation, no dropout
        )


def log_bucket_position(relative: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """Relative positions kept exact within ±bucket_size/2, log-spaced beyond (DeBERTa-v2):
    sign(r) · (mid + ⌈log(|r|/mid) / log((max_position−1)/mid) · (mid−1)⌉) for |r| > mid."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    inside = (relative < mid) & (relative > -mid)
    abs_pos = torch.where(inside, torch.full_like(relative, mid - 1), relative.abs())
    ratio = torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    log_pos = torch.ceil(ratio * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.to(log_pos.dtype), log_pos * sign).long()


def relative_positions(t: int, cfg: DebertaConfig, device: torch.device | None = None) -> Tensor:
    """δ(i, j) = i − j for T positions, log-bucketed if ``position_buckets``: (T, T) long."""
    ids = torch.arange(t, device=device)
    relative = ids[:, None] - ids[None, :]  # (T, T)
    if cfg.position_buckets > 0:
        relative = log_bucket_position(relative, cfg.position_buckets, cfg.max_position)
    return relative


class DisentangledSelfAttention(nn.Module):
    """Self-attention whose scores add content-to-position and position-to-content terms."""

    is_attention = True  # record_attention labels its calls with this module's name

    def __init__(self, cfg: DebertaConfig) -> None:
        super().__init__()
        D = cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, D // cfg.n_heads
        self.span = cfg.span
        self.c2p, self.p2c = "c2p" in cfg.pos_att, "p2c" in cfg.pos_att
        self.qkv = nn.Linear(D, 3 * D)  # rows: queries, keys, values
        self.out_proj = nn.Linear(D, D)
        self.pos_key = nn.Linear(D, D) if self.c2p and not cfg.share_att_key else None
        self.pos_query = nn.Linear(D, D) if self.p2c and not cfg.share_att_key else None
        self.pos_dropout = nn.Dropout(cfg.dropout)
        self.attn_dropout = cfg.attn_dropout

    def _heads(self, t: Tensor) -> Tensor:
        """(..., T, D) -> (..., H, T, Dh)."""
        return t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(-3, -2)

    def forward(
        self,
        x: Tensor,
        rel_table: Tensor,
        rel_pos: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), rel_table (2k, D), rel_pos (T, T) -> (B, T, D), weights (B, H, T, T)."""
        B, T, D = x.shape
        q, k, v = (self._heads(t) for t in self.qkv(x).split(D, dim=-1))  # (B, H, T, Dh)
        w_q, w_k, _ = self.qkv.weight.split(D)
        b_q, b_k, _ = self.qkv.bias.split(D)
        r = self.pos_dropout(rel_table[: 2 * self.span])  # (2k, D)
        factor = 1 + self.c2p + self.p2c
        scale = (self.head_dim * factor) ** -0.5  # eq. 4: 1/√(3d) with both position terms
        bias = torch.zeros((), dtype=x.dtype, device=x.device)
        if self.c2p:  # A^{c→p}_{i,j} = q_i · k^r_{δ(i,j)}
            key_r = self.pos_key(r) if self.pos_key else nn.functional.linear(r, w_k, b_k)
            c2p = q @ self._heads(key_r).transpose(-1, -2)  # (B, H, T, 2k)
            index = (rel_pos + self.span).clamp(0, 2 * self.span - 1)  # (T, T)
            bias = bias + c2p.gather(-1, index.expand(B, self.n_heads, T, T))  # (B, H, T, T)
        if self.p2c:  # A^{p→c}_{i,j} = k_j · q^r_{δ(j,i)}
            query_r = self.pos_query(r) if self.pos_query else nn.functional.linear(r, w_q, b_q)
            p2c = k @ self._heads(query_r).transpose(-1, -2)  # (B, H, T, 2k): key j, distance
            index = (-rel_pos + self.span).clamp(0, 2 * self.span - 1)  # (T, T)
            p2c = p2c.gather(-1, index.expand(B, self.n_heads, T, T))  # (B, H, Tk, Tq)
            bias = bias + p2c.transpose(-1, -2)  # (B, H, Tq, Tk)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            need_weights=need_weights,
            bias=bias * scale,
            scale=scale,
        )  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out_proj(out), weights


class DebertaLayer(nn.Module):
    """BERT's post-norm block with disentangled attention and the core FeedForward."""

    def __init__(self, cfg: DebertaConfig) -> None:
        super().__init__()
        block = cfg.block_config()
        self.attn = DisentangledSelfAttention(cfg)
        self.norm1 = block.make_norm()
        self.ff = block.feed_forward()
        self.norm2 = block.make_norm()
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        rel_table: Tensor,
        rel_pos: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(x, rel_table, rel_pos, mask, need_weights)
        x = self.norm1(x + self.dropout(a))  # (B, T, D)
        return self.norm2(x + self.dropout(self.ff(x))), weights


class DebertaEmbeddings(nn.Module):
    """word (+ absolute position) (+ token type) -> projection E -> D -> LayerNorm, × real."""

    def __init__(self, cfg: DebertaConfig) -> None:
        super().__init__()
        E = cfg.emb
        self.word = nn.Embedding(cfg.vocab_size, E, padding_idx=cfg.pad_id)
        self.position = nn.Embedding(cfg.context, E) if cfg.position_biased_input else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.project = nn.Linear(E, cfg.d_model, bias=False) if cfg.d_model != E else None
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: Tensor, real: Tensor | None, token_type_ids: Tensor | None) -> Tensor:
        """ids (B, T), real (B, T) bool or None -> (B, T, D); padding positions are zero."""
        x = self.word(ids)  # (B, T, E)
        if self.position is not None:
            x = x + self.position(torch.arange(ids.shape[1], device=ids.device))
        if self.token_type is not None:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        if self.project is not None:
            x = self.project(x)  # (B, T, D)
        x = self.norm(x)
        if real is not None:
            x = x * real[..., None].to(x.dtype)
        return self.dropout(x)


class DebertaModel(nn.Module):
    """DebertaV2Model: embeddings, a shared relative-position table, N disentangled layers."""

    def __init__(self, cfg: DebertaConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.embeddings = DebertaEmbeddings(cfg)
        self.rel_embeddings = nn.Embedding(2 * cfg.span, cfg.d_model)
        self.rel_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norm_rel_ebd else None
        self.layers = nn.ModuleList(DebertaLayer(cfg) for _ in range(cfg.n_layers))
        init_bert_weights(self)

    def forward(
        self,
        input_ids: Tensor,
        lengths: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """ids (B, T) right-padded to ``lengths`` (B,) -> hidden (B, T, D) [, weights]."""
        T = input_ids.shape[1]
        if self.cfg.position_biased_input and self.cfg.context < T:
            raise UserError(f"input has {T} tokens; this model has {self.cfg.context} positions")
        mask = None if lengths is None else padding_mask(lengths, T)  # (B, 1, 1, T)
        real = None if mask is None else mask[:, 0, 0]  # (B, T)
        x = self.embeddings(input_ids, real, token_type_ids)  # (B, T, D)
        table = self.rel_embeddings.weight  # (2k, D)
        if self.rel_norm is not None:
            table = self.rel_norm(table)
        rel_pos = relative_positions(T, self.cfg, input_ids.device)  # (T, T)
        weights = []
        for layer in self.layers:
            x, w = layer(x, table, rel_pos, mask, need_weights)
            if w is not None:
                weights.append(w)
        return (x, weights) if need_weights else x


register_model(
    "deberta",
    family="deberta",
    config=DebertaConfig,
    oracle="DeBERTa-v2/v3 + gradients",
    example=tokens(lengths=True),
    tiny={"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "context": 16},
)(DebertaModel)
