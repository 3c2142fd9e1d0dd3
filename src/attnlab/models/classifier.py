"""TextClassifier: token embeddings, positions, a Transformer encoder, masked pooling, a head;
and TextClassifierEnsemble, several of them trained side by side whose probabilities are averaged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.compress.heads import apply_head_counts
from attnlab.configs import ConfigBase, project, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend, padding_mask
from attnlab.layers.blocks import (
    Activation,
    Block,
    BlockConfig,
    BlockStack,
    NormKind,
    NormPosition,
    block_setting,
)
from attnlab.layers.efficient import AttentionKind
from attnlab.layers.positions import make_positions
from attnlab.models.registry import register_model, tokens

Position = Literal["sinusoidal", "learned", "rope", "t5", "alibi", "none"]
Pooling = Literal["mean", "max", "cls"]
POSITIONS: tuple[str, ...] = get_args(Position)
POOLINGS: tuple[str, ...] = get_args(Pooling)


@dataclass
class ClassifierConfig(ConfigBase):
    """Everything that defines a TextClassifier; saved as config.json in the run directory."""

    vocab_size: int = setting(0, min=1, unset=0, set_by="the tokenizer")
    n_classes: int = setting(2, min=2)
    d_model: int = block_setting("d_model", 128)
    n_heads: int = block_setting("n_heads", 4)
    n_layers: int = setting(2, min=1)
    d_ff: int = block_setting("d_ff", 512)
    dropout: float = block_setting("dropout", 0.1)
    attn_dropout: float = block_setting("attn_dropout", 0.1)
    emb_dropout: float = setting(0.1, min=0.0, below=1.0)
    activation: Activation = block_setting("activation", "gelu")
    norm: NormKind = block_setting("norm", "layer")
    dyt_alpha0: float = block_setting("dyt_alpha0")
    norm_position: NormPosition = block_setting("norm_position", "pre")
    pos: Position = setting("sinusoidal")
    pooling: Pooling = setting("mean")
    context: int = setting(256, "longest input the model accepts (learned positions)", min=1)
    bigram_buckets: int = setting(
        0, ">0 adds hashed character-bigram embeddings to each position", min=0
    )
    ngram_buckets: int = setting(
        0, ">0 adds a bag of hashed 1..ngram_max-grams beside the pooled state", min=0
    )
    ngram_max: int = setting(3, "longest character n-gram in that bag", min=1)
    token_dropout: float = setting(
        0.0, "training only: replace this share of tokens with <unk>", min=0.0, below=1.0
    )
    pad_id: int = setting(0)
    unk_id: int = setting(1)
    cls_id: int = setting(2)
    gradient_checkpointing: bool = setting(False)
    attention: AttentionKind = block_setting("attention", "full")
    window: int = block_setting("window", 0)
    n_global: int = block_setting("n_global", 0)
    backend: Backend = block_setting("backend", "fused")
    members: int = setting(
        1, ">1: an ensemble of this many classifiers, probabilities averaged", min=1
    )
    heads_per_layer: tuple[int, ...] = setting(
        (), "set by `attnlab prune`: heads each attention layer keeps (empty: all)"
    )

    def check(self) -> None:
        if self.attention == "linear" and self.pos in ("t5", "alibi"):
            raise UserError(
                f"pos={self.pos!r} adds a bias to attention scores, which linear attention does "
                "not form; use pos='sinusoidal', 'learned' or 'rope' with attention='linear'"
            )
        self.block_config()  # head counts, attention kernel

    def block_config(self) -> BlockConfig:
        """The bidirectional encoder block every layer is built from."""
        return project(self, BlockConfig)


class TextClassifier(nn.Module):
    """Embeds token ids, encodes them with N Transformer blocks, pools real tokens, classifies.

    Padding is masked out of attention and of pooling. With ``pooling="cls"`` the caller's
    ids must start with the ``<cls>`` token (the tokenizer's ``add_cls=True``).
    """

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        D = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, D, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, std=D**-0.5)
        self.embed_scale = D**0.5  # unit-variance entries after scaling, on a par with positions
        with torch.no_grad():
            self.embed.weight[cfg.pad_id].zero_()
        self.bigram = None
        if cfg.bigram_buckets > 0:
            self.bigram = nn.Embedding(cfg.bigram_buckets, D)
            nn.init.normal_(self.bigram.weight, std=D**-0.5)
        positions = make_positions(cfg.pos, D, cfg.n_heads, cfg.context)
        self.abs_pos = positions.absolute  # sinusoidal / learned, or None
        self.rel_bias = positions.bias  # T5 / ALiBi, or None
        self.emb_dropout = nn.Dropout(cfg.emb_dropout)
        block = cfg.block_config()
        blocks = [Block(block, positions.rotary) for _ in range(cfg.n_layers)]
        pre = cfg.norm_position == "pre"
        self.encoder = BlockStack(blocks, block.make_norm() if pre else None)
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.ngram_bag = None
        if cfg.ngram_buckets > 0:
            self.ngram_bag = nn.Embedding(cfg.ngram_buckets, D)
            nn.init.normal_(self.ngram_bag.weight, std=0.02)
        self.head_dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(2 * D if self.ngram_bag is not None else D, cfg.n_classes)
        apply_head_counts(self, cfg.heads_per_layer)  # a pruned run's smaller attention layers

    def bigram_ids(self, input_ids: Tensor) -> Tensor:
        """Hash each (previous, current) id pair into ``bigram_buckets`` ids: (B, T) -> (B, T)."""
        prev = torch.nn.functional.pad(input_ids[:, :-1], (1, 0), value=self.cfg.pad_id)
        return (prev * 1_000_003 + input_ids) % self.cfg.bigram_buckets

    def ngram_ids(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Hashed ids of every 1..ngram_max-gram that lies inside the real tokens.

        ids (B, T), lengths (B,) -> (ids (B, G), valid (B, G)) with G = sum_k (T - k + 1); n-grams
        that touch padding (or the <cls> token) are marked invalid. The hash folds the k ids
        with a large prime and adds k, so a k-gram and a (k+1)-gram rarely share a bucket.
        """
        B, T = input_ids.shape
        ids, valid = [], []
        start = 1 if self.cfg.pooling == "cls" else 0  # <cls> is not text
        for k in range(1, self.cfg.ngram_max + 1):
            if T - start < k:
                break
            n = T - k + 1
            h = torch.zeros(B, n, dtype=torch.long, device=input_ids.device)
            for j in range(k):
                h = (h * 1_000_003 + input_ids[:, j : j + n]) % (1 << 40)  # (B, n)
            pos = torch.arange(n, device=input_ids.device)  # first position of each k-gram
            ids.append((h * 31 + k) % self.cfg.ngram_buckets)
            valid.append((pos[None] >= start) & (pos[None] + k <= lengths[:, None]))  # (B, n)
        return torch.cat(ids, dim=1), torch.cat(valid, dim=1)

    def ngram_features(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """Mean embedding of the text's hashed n-grams (fastText, Joulin et al. 2017): (B, D)."""
        assert self.ngram_bag is not None
        ids, valid = self.ngram_ids(input_ids, lengths)  # (B, G), (B, G)
        keep = valid[..., None].to(self.ngram_bag.weight.dtype)  # (B, G, 1)
        summed = (self.ngram_bag(ids) * keep).sum(dim=1)  # (B, D)
        return summed / keep.sum(dim=1).clamp(min=1)

    def features(self, h: Tensor, mask: Tensor, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """What the head reads: the pooled states (B, D), with the n-gram bag beside them."""
        pooled = self.pool(h, mask)  # (B, D)
        if self.ngram_bag is None:
            return pooled
        return torch.cat([pooled, self.ngram_features(input_ids, lengths)], dim=-1)  # (B, 2D)

    def encode(
        self, input_ids: Tensor, lengths: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """ids (B, T), lengths (B,) -> hidden (B, T, D), key mask (B, 1, 1, T), weights."""
        B, T = input_ids.shape
        if self.cfg.context < T and self.cfg.pos == "learned":
            raise ValueError(
                f"input has {T} tokens but the model was built with context={self.cfg.context}; "
                "truncate the input (the tokenizer's max_len) or retrain with a larger context"
            )
        mask = padding_mask(lengths, T)  # (B, 1, 1, T)
        if self.training and self.cfg.token_dropout > 0:  # word dropout (Iyyer et al. 2015)
            drop = torch.rand(B, T, device=input_ids.device) < self.cfg.token_dropout
            drop &= mask[:, 0, 0, :] & (input_ids != self.cfg.cls_id)
            input_ids = input_ids.masked_fill(drop, self.cfg.unk_id)  # (B, T)
        x = self.embed(input_ids) * self.embed_scale  # (B, T, D), √D as in Vaswani et al. §3.4
        if self.bigram is not None:
            x = x + self.bigram(self.bigram_ids(input_ids)) * mask[:, 0, 0, :, None]
        if self.abs_pos is not None:
            x = self.abs_pos(x)
        x = self.emb_dropout(x)
        bias = None if self.rel_bias is None else self.rel_bias(T, T)  # (1, H, T, T)
        if need_weights:
            x, weights = self.encoder(x, mask, bias=bias, need_weights=True)
        else:
            x, weights = self.encoder(x, mask, bias=bias), []
        return x, mask, weights

    def pool(self, h: Tensor, mask: Tensor) -> Tensor:
        """Masked pooling of hidden states (B, T, D) -> (B, D); padding never contributes."""
        keep = mask[:, 0, 0, :, None]  # (B, T, 1)
        if self.cfg.pooling == "cls":
            return h[:, 0]  # (B, D)
        if self.cfg.pooling == "max":
            return h.masked_fill(~keep, torch.finfo(h.dtype).min).amax(dim=1)  # (B, D)
        counts = keep.sum(dim=1).clamp(min=1)  # (B, 1)
        return (h * keep).sum(dim=1) / counts  # (B, D)

    def forward(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """ids (B, T), lengths (B,) -> class logits (B, C)."""
        h, mask, _ = self.encode(input_ids, lengths)
        return self.head(self.head_dropout(self.features(h, mask, input_ids, lengths)))  # (B, C)

    @torch.no_grad()
    def inspect(self, input_ids: Tensor, lengths: Tensor) -> dict[str, Tensor]:
        """Logits, per-layer attention (L, B, H, T, T) and each token's share of the pooled vector.

        The share comes from attention rollout (Abnar & Zuidema 2020): the product over layers
        of (head-averaged attention + identity, row-normalised), read at the rows that pooling
        uses (the ``<cls>`` row, or the mean over real tokens for mean/max pooling). In a
        pruned model a layer's kept heads come first and its removed ones are all zeros.
        """
        h, mask, weights = self.encode(input_ids, lengths, need_weights=True)
        logits = self.head(self.features(h, mask, input_ids, lengths))  # (B, C)
        H = self.cfg.n_heads
        attn = torch.stack([F.pad(w, (0, 0, 0, 0, 0, H - w.shape[1])) for w in weights])
        T = input_ids.shape[1]
        eye = torch.eye(T, dtype=attn.dtype, device=attn.device)
        rollout = eye.expand(input_ids.shape[0], T, T)  # (B, T, T)
        for layer in weights:  # (B, H_l, T, T): the mean over the heads the layer has
            a = layer.mean(dim=1) + eye  # (B, T, T)
            a = a / a.sum(dim=-1, keepdim=True)
            rollout = a @ rollout
        keep = mask[:, 0, 0, :].to(attn.dtype)  # (B, T)
        if self.cfg.pooling == "cls":
            share = rollout[:, 0]  # (B, T)
        else:
            share = (rollout * keep[:, :, None]).sum(1) / keep.sum(1, keepdim=True)  # (B, T)
        share = share * keep
        share = share / share.sum(dim=-1, keepdim=True)
        return {"logits": logits, "attention": attn, "token_share": share}


class TextClassifierEnsemble(nn.Module):
    """``members`` TextClassifiers with their own initialisation and dropout, trained side by side.

    Each member is trained on its own loss (independent members, as in Lakshminarayanan et al.
    2017, "deep ensembles"; the task's step averages the members' losses), and the ensemble
    predicts the mean of the members' probabilities. ``forward`` returns the log of that mean,
    so softmax, argmax and cross-entropy read it like any classifier's logits.
    """

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.members = nn.ModuleList(TextClassifier(cfg) for _ in range(cfg.members))

    def forward(self, input_ids: Tensor, lengths: Tensor, per_member: bool = False) -> Tensor:
        """ids (B, T), lengths (B,) -> log mean probability (B, C), or member logits (M, B, C)."""
        logits = torch.stack([m(input_ids, lengths) for m in self.members])  # (M, B, C)
        if per_member:
            return logits
        return logits.log_softmax(-1).logsumexp(0) - math.log(len(self.members))  # (B, C)

    @torch.no_grad()
    def inspect(self, input_ids: Tensor, lengths: Tensor, member: int = 0) -> dict[str, Tensor]:
        """One member's attention and token shares (heads of different members are unrelated,
        so they are never averaged), with the ensemble's logits."""
        if not 0 <= member < len(self.members):
            raise ValueError(f"member must be in 0..{len(self.members) - 1}, got {member}")
        info = self.members[member].inspect(input_ids, lengths)
        info["logits"] = self(input_ids, lengths)  # (B, C)
        return info


def build_classifier(cfg: ClassifierConfig) -> TextClassifier | TextClassifierEnsemble:
    """A TextClassifier, or an ensemble of them when ``cfg.members > 1``."""
    return TextClassifierEnsemble(cfg) if cfg.members > 1 else TextClassifier(cfg)


register_model(
    "char",
    family="char",
    config=ClassifierConfig,
    oracle="Block (encoder layer)",
    example=tokens(lengths=True),
    defaults={"vocab_size": 5000},  # about the bundled reviews' character vocabulary
    tiny={"vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32, "context": 16},
    note="its blocks are proven; the pooling and head are the classify tests'",
)(build_classifier)
