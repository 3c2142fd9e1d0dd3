"""TextClassifier: token embeddings, positions, a Transformer encoder, masked pooling, a head;
and TextClassifierEnsemble, several of them trained side by side whose probabilities are averaged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.attention import padding_mask
from attnlab.blocks import Encoder, EncoderBlock, make_norm
from attnlab.efficient import check_attention_config
from attnlab.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
)

POSITIONS = ("sinusoidal", "learned", "rope", "t5", "alibi", "none")
POOLINGS = ("mean", "max", "cls")


@dataclass
class ClassifierConfig:
    """Everything that defines a TextClassifier; saved as config.json in the run directory."""

    vocab_size: int = 0  # set from the tokenizer
    n_classes: int = 2
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1
    attn_dropout: float = 0.1
    emb_dropout: float = 0.1
    activation: str = "gelu"
    norm: str = "pre"  # pre | post  (where the norm sits around each sub-layer)
    norm_type: str = "layer"  # layer | rms
    pos: str = "sinusoidal"  # sinusoidal | learned | rope | t5 | alibi | none
    pooling: str = "mean"  # mean | max | cls
    max_len: int = 256  # longest input the model accepts (learned positions need it)
    bigram_buckets: int = 0  # >0 adds hashed character-bigram embeddings to each position
    ngram_buckets: int = 0  # >0 adds a bag of hashed 1..ngram_max-grams beside the pooled state
    ngram_max: int = 3  # longest character n-gram in that bag
    token_dropout: float = 0.0  # training only: replace this share of tokens with <unk>
    pad_id: int = 0
    unk_id: int = 1
    cls_id: int = 2
    gradient_checkpointing: bool = False
    attention: str = "full"  # full | local (sliding window) | linear (elu+1 feature map)
    window: int = 0  # attention="local": keys within this distance each side, itself included
    n_global: int = 0  # attention="local": leading tokens (e.g. <cls>) that see and are seen by all
    members: int = 1  # >1: an ensemble of this many classifiers, probabilities averaged

    def validate(self) -> None:
        """Raise ValueError naming the field and the valid choices."""
        if self.vocab_size <= 0:
            raise ValueError("vocab_size must be set (build the tokenizer first)")
        check_attention_config(self.attention, self.window, self.n_global)
        if self.members < 1:
            raise ValueError(f"members must be >= 1 (1 = a single model), got {self.members}")
        if self.attention == "linear" and self.pos in ("t5", "alibi"):
            raise ValueError(
                f"pos={self.pos!r} adds a bias to attention scores, which linear attention does "
                "not form; use pos='sinusoidal', 'learned' or 'rope' with attention='linear'"
            )
        if self.pos not in POSITIONS:
            raise ValueError(f"pos must be one of {POSITIONS}, got {self.pos!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {self.norm!r}")
        if self.ngram_buckets < 0 or self.ngram_max < 1:
            raise ValueError(
                f"ngram_buckets must be >= 0 and ngram_max >= 1, got {self.ngram_buckets} and "
                f"{self.ngram_max}"
            )
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "change one of them"
            )


class TextClassifier(nn.Module):
    """Embeds token ids, encodes them with N Transformer blocks, pools real tokens, classifies.

    Padding is masked out of attention and of pooling. With ``pooling="cls"`` the caller's
    ids must start with the ``<cls>`` token (the tokenizer's ``add_cls=True``).
    """

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        cfg.validate()
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
        self.abs_pos: nn.Module | None = None
        self.rel_bias: nn.Module | None = None
        rotary = None
        if cfg.pos == "sinusoidal":
            self.abs_pos = SinusoidalPositionalEncoding(D, cfg.max_len)
        elif cfg.pos == "learned":
            self.abs_pos = LearnedPositionalEmbedding(cfg.max_len, D)
        elif cfg.pos == "rope":
            rotary = RotaryEmbedding(D // cfg.n_heads, max_len=cfg.max_len)
        elif cfg.pos == "t5":
            self.rel_bias = T5RelativePositionBias(cfg.n_heads, bidirectional=True)
        elif cfg.pos == "alibi":
            self.rel_bias = ALiBi(cfg.n_heads)
        self.emb_dropout = nn.Dropout(cfg.emb_dropout)
        pre = cfg.norm == "pre"
        blocks = [
            EncoderBlock(
                D,
                cfg.n_heads,
                cfg.d_ff,
                dropout=cfg.dropout,
                attn_dropout=cfg.attn_dropout,
                activation=cfg.activation,  # type: ignore[arg-type]
                norm_first=pre,
                norm=cfg.norm_type,  # type: ignore[arg-type]
                rotary=rotary,
                attention=cfg.attention,
                window=cfg.window,
                n_global=cfg.n_global,
            )
            for _ in range(cfg.n_layers)
        ]
        self.encoder = Encoder(blocks, make_norm(cfg.norm_type, D) if pre else None)  # type: ignore[arg-type]
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.ngram_bag = None
        if cfg.ngram_buckets > 0:
            self.ngram_bag = nn.Embedding(cfg.ngram_buckets, D)
            nn.init.normal_(self.ngram_bag.weight, std=0.02)
        self.head_dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(2 * D if self.ngram_bag is not None else D, cfg.n_classes)

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
        self, input_ids: Tensor, lengths: Tensor, return_weights: bool = False
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """ids (B, T), lengths (B,) -> hidden (B, T, D), key mask (B, 1, 1, T), weights."""
        B, T = input_ids.shape
        if self.cfg.max_len < T and self.cfg.pos == "learned":
            raise ValueError(
                f"input has {T} tokens but the model was built with max_len={self.cfg.max_len}; "
                "truncate the input (the tokenizer's max_len) or retrain with a larger max_len"
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
        if return_weights:
            x, weights = self.encoder(x, mask, bias=bias, return_weights=True)
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
        uses (the ``<cls>`` row, or the mean over real tokens for mean/max pooling).
        """
        h, mask, weights = self.encode(input_ids, lengths, return_weights=True)
        logits = self.head(self.features(h, mask, input_ids, lengths))  # (B, C)
        attn = torch.stack(weights)  # (L, B, H, T, T)
        T = input_ids.shape[1]
        eye = torch.eye(T, dtype=attn.dtype)
        rollout = eye.expand(input_ids.shape[0], T, T)  # (B, T, T)
        for layer in attn:
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
        cfg.validate()
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
