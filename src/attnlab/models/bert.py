"""BERT (Devlin et al. 2019) built from attnlab's core: embeddings, post-norm blocks, heads.

BertModel = word + learned position + token-type embeddings -> LayerNorm -> dropout -> N
post-norm Blocks (exact erf GELU) -> hidden states (B, T, D), plus the pooler
tanh(W h_[CLS] + b). BertForMaskedLM adds the MLM head (dense -> GELU -> LayerNorm -> decoder
tied to the word embeddings + bias); BertClassifier adds dropout and a linear layer on a pooled
vector. Hugging Face checkpoint folders load through :mod:`attnlab.models.bert_folder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.compress.heads import apply_head_counts
from attnlab.configs import ConfigBase, coerce_value, project, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend, padding_mask
from attnlab.layers.blocks import Block, BlockConfig, BlockStack, block_setting
from attnlab.layers.dropout import Dropout
from attnlab.layers.efficient import AttentionKind
from attnlab.layers.positions import make_positions
from attnlab.models.registry import register_model, tokens
from attnlab.models.skip_init import init_skipped

BertActivation = Literal["gelu", "gelu_tanh", "relu"]  # those a Hugging Face config can name
# Hugging Face ``hidden_act`` -> attnlab FeedForward activation.
HF_ACTIVATIONS: dict[str, BertActivation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
POOLINGS = ("mean", "cls")
# ``model_type`` values of a Hugging Face config.json that load as this encoder (XLM-R is BERT
# with SentencePiece pieces and a position table offset past the padding index).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("bert", "xlm-roberta")


@dataclass
class BertConfig(ConfigBase):
    """The architecture of a BERT encoder (field names are attnlab's; see ``from_hf``)."""

    vocab_size: int = setting(30522, min=1)
    d_model: int = block_setting("d_model", 768)
    n_layers: int = setting(12, min=1)
    n_heads: int = block_setting("n_heads", 12)
    d_ff: int = block_setting("d_ff", 3072)
    context: int = setting(512, "positions in the learned table (max_position_embeddings)", min=1)
    type_vocab_size: int = setting(2, min=1)
    norm_eps: float = block_setting("norm_eps", 1e-12)
    dropout: float = block_setting("dropout", 0.1)
    attn_dropout: float = block_setting("attn_dropout", 0.1)
    activation: BertActivation = block_setting("activation", "gelu")
    pad_id: int = setting(0)
    position_offset: int = setting(
        0,
        "rows of a Hugging Face position table before position 0 (XLM-R: padding index + 1); "
        "above 0, positions count the non-pad ids as XLM-R does",
        min=0,
    )
    packed_words: bool = setting(
        False, "word table kept as frozen 4-bit Q4_0 blocks (multilingual-e5's file)"
    )
    gradient_checkpointing: bool = setting(
        False, "recompute block activations in backward (less memory)"
    )
    attention: AttentionKind = block_setting("attention", "full")
    window: int = block_setting("window", 0)
    n_global: int = block_setting("n_global", 0)
    backend: Backend = block_setting("backend", "fused")
    heads_per_layer: tuple[int, ...] = setting(
        (), "set by `attnlab prune`: heads each attention layer keeps (empty: all)"
    )

    def check(self) -> None:
        self.block_config()  # head counts, attention kernel

    def block_config(self) -> BlockConfig:
        """BERT's post-norm encoder block: dropout on each sub-layer's output and on the
        attention weights, none between the feed-forward layer's two matmuls (Devlin et al.;
        transformers' BertIntermediate is dense + activation, its BertOutput dense + dropout)."""
        return project(self, BlockConfig, norm_position="post", ffn_dropout=0.0)

    @classmethod
    def from_hf(cls, hf: Any) -> BertConfig:
        """Read a Hugging Face BERT ``config.json`` dict (a UserError for one that is not)."""
        if not isinstance(hf, dict):
            what = "null" if hf is None else f"a JSON {type(hf).__name__}"
            raise UserError(f"config.json holds {what}, not the JSON object of a BERT config")
        kind = hf.get("model_type", "bert")
        if kind not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"config.json describes a {kind!r} model; only BERT and XLM-R checkpoints load "
                f"(model_type {', '.join(map(repr, SUPPORTED_MODEL_TYPES))})"
            )
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(
                f"position_embedding_type {hf['position_embedding_type']!r} is not supported; "
                "only 'absolute' (learned) positions are implemented"
            )
        act = hf.get("hidden_act", "gelu")
        if not isinstance(act, str) or act not in HF_ACTIVATIONS:
            raise UserError(
                f"hidden_act {act!r} is not supported; use one of {list(HF_ACTIVATIONS)}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if k not in hf]
        if missing:
            raise UserError(f"config.json lacks {missing}; is this a BERT config?")
        # each value is read under its Hugging Face name, so a bad one is named as written
        d_model = coerce_value(hf["hidden_size"], int, "hidden_size")
        values = {
            ours: coerce_value(hf.get(theirs, default), type(default), theirs)
            for ours, theirs, default in (
                ("vocab_size", "vocab_size", 0),
                ("n_layers", "num_hidden_layers", 0),
                ("n_heads", "num_attention_heads", 12),
                ("d_ff", "intermediate_size", 4 * d_model),
                ("context", "max_position_embeddings", 512),
                ("type_vocab_size", "type_vocab_size", 2),
                ("norm_eps", "layer_norm_eps", 1e-12),
                ("dropout", "hidden_dropout_prob", 0.1),
                ("attn_dropout", "attention_probs_dropout_prob", 0.1),
            )
        }
        pad_id = coerce_value(hf.get("pad_token_id") or 0, int, "pad_token_id")  # null: 0
        offset = pad_id + 1 if kind == "xlm-roberta" else 0  # rows before position 0
        if values["context"] <= offset:
            raise UserError(
                f"max_position_embeddings {values['context']} leaves no position after the "
                f"{offset} rows XLM-R keeps before the first token; is this config whole?"
            )
        values["context"] -= offset
        return cls(d_model=d_model, activation=HF_ACTIVATIONS[act], pad_id=pad_id,
                   position_offset=offset, **values)  # fmt: skip

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict of this architecture."""
        act = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[self.activation]
        return {
            "architectures": ["BertForMaskedLM"],
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "intermediate_size": self.d_ff,
            "max_position_embeddings": self.context,
            "type_vocab_size": self.type_vocab_size,
            "layer_norm_eps": self.norm_eps,
            "hidden_dropout_prob": self.dropout,
            "attention_probs_dropout_prob": self.attn_dropout,
            "hidden_act": act,
            "pad_token_id": self.pad_id,
            "position_embedding_type": "absolute",
            "initializer_range": 0.02,
        }


class Q4Embedding(nn.Module):
    """A frozen word table stored as Q4_0 blocks, dequantised only for the rows looked up.

    Each row holds ``d_model / 32`` blocks of 32 weights: 16 bytes of nibbles (byte j: weight j
    low, weight j + 16 high) and one fp16 scale d; w = (q - 8) · d. 250k rows of width 384 take
    54 MB this way instead of 384 MB in float32, and the values are exactly the published
    quantised weights. The table is a buffer: it has no gradient.
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        if d_model % 32:
            raise ValueError(f"packed_words needs d_model divisible by 32, got {d_model}")
        self.register_buffer("codes", torch.zeros(vocab_size, d_model // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.zeros(vocab_size, d_model // 32, dtype=torch.float16))

    @property
    def weight(self) -> Tensor:
        """The whole table as float32 (V, D): for export and for tying an output layer."""
        return unpack_q4(self.codes, self.scales)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> (B, T, D) float32."""
        return unpack_q4(self.codes[ids], self.scales[ids])


def unpack_q4(codes: Tensor, scales: Tensor) -> Tensor:
    """(…, D / 2) uint8 nibbles and (…, D / 32) fp16 scales -> (…, D) float32."""
    lead = codes.shape[:-1]
    packed = codes.reshape(*lead, -1, 16)  # (…, blocks, 16)
    low, high = (packed & 0x0F).float(), (packed >> 4).float()  # weights j and j + 16
    q = torch.cat([low, high], dim=-1) - 8.0  # (…, blocks, 32)
    return (q * scales.float().unsqueeze(-1)).reshape(*lead, -1)  # (…, D)


class BertEmbeddings(nn.Module):
    """LayerNorm(word(ids) + position(t) + token_type(segment)), then dropout."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word: nn.Module = (
            Q4Embedding(cfg.vocab_size, cfg.d_model)
            if cfg.packed_words
            else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.position = make_positions("learned", cfg.d_model, cfg.n_heads, cfg.context).absolute
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.pad_id = cfg.pad_id
        self.skip_pad = cfg.position_offset > 0  # XLM-R numbers positions over non-pad ids

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """ids (B, T), segments (B, T) or None (all 0) -> (B, T, D)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        words = self.word(input_ids)  # (B, T, D)
        if self.skip_pad:
            # fairseq's make_positions: the t-th non-pad id reads row t, a pad id (one typed
            # inside a text as well as the padding) adds no position
            real = input_ids != self.pad_id  # (B, T)
            index = (real.cumsum(1) - 1).clamp(min=0)  # (B, T)
            x = words + self.position.embedding(index) * real.unsqueeze(-1)  # (B, T, D)
        else:
            x = self.position(words)  # (B, T, D)
        x = x + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class BertModel(nn.Module):
    """The BERT encoder: embeddings, post-norm Transformer blocks and the [CLS] pooler."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        block = cfg.block_config()
        self.encoder = BlockStack([Block(block) for _ in range(cfg.n_layers)])
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
        apply_head_counts(self, cfg.heads_per_layer)  # a pruned run's smaller attention layers
        init_bert_weights(self)

    def forward(
        self,
        input_ids: Tensor,
        lengths: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        stop: int | None = None,
    ) -> Tensor:
        """ids (B, T) right-padded to ``lengths`` (B,) (None = no padding) -> hidden (B, T, D):
        the top block's output, or with ``stop`` that of the embeddings and blocks below it."""
        B, T = input_ids.shape
        if self.cfg.context < T:
            raise ValueError(
                f"input has {T} tokens but this BERT has {self.cfg.context} positions; "
                f"truncate to context={self.cfg.context}"
            )
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        return self.encoder(x, _key_mask(lengths, T), stop=stop)  # type: ignore[return-value]

    def forward_from(self, hidden: Tensor, lengths: Tensor, start: int) -> Tensor:
        """Blocks ``start`` and up on ``hidden`` (B, T, D), the output of the blocks below
        (kept once while they are frozen) right-padded to ``lengths`` (B,) -> (B, T, D)."""
        if not 0 <= start <= self.cfg.n_layers:
            raise ValueError(f"start must be in 0..{self.cfg.n_layers}, got {start}")
        mask = _key_mask(lengths, hidden.shape[1])
        return self.encoder(hidden, mask, start=start)  # type: ignore[return-value]

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler: tanh(W h_[CLS] + b), (B, T, D) -> (B, D)."""
        return torch.tanh(self.pooler(hidden[:, 0]))


def _key_mask(lengths: Tensor | None, T: int) -> Tensor | None:
    """The padding mask (B, 1, 1, T) of a batch, or None when no row is padded: attention may
    then take SDPA's unmasked kernels (a traced graph keeps the mask: it must serve every
    batch)."""
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    if lengths is None or (not tracing and bool((lengths == T).all())):
        return None
    return padding_mask(lengths, T)


def mean_pool(hidden: Tensor, lengths: Tensor) -> Tensor:
    """Mean of the real (non-padding) token vectors: (B, T, D), (B,) -> (B, D)."""
    keep = padding_mask(lengths, hidden.shape[1])[:, 0, 0, :, None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)


def init_bert_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm, zero pad row."""
    if init_skipped():  # weights about to be loaded whole: no draws to overwrite
        return
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, Q4Embedding):
            m.codes.random_(0, 256)  # uniform nibbles: w ~ U{-8..7} · d, std ≈ 4.6 d
            m.scales.fill_(0.02 / 4.6)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BertMLMHead(nn.Module):
    """Masked-LM head: LayerNorm(GELU(W h)) · Eᵀ + b, E the (tied) word embeddings."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.activation = cfg.activation
        self.transform = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        init_bert_weights(self)

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        """h (..., D), word embeddings (V, D) -> logits (..., V)."""
        h = self.transform(h)
        if self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return F.linear(self.norm(h), word_embeddings, self.bias)  # (..., V)


class BertForMaskedLM(nn.Module):
    """BERT with its masked-language-model head (decoder tied to the word embeddings)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.bert = BertModel(cfg)
        self.mlm = BertMLMHead(cfg)

    def forward(
        self, input_ids: Tensor, lengths: Tensor | None = None, where: Tensor | None = None
    ) -> Tensor:
        """ids (B, T), lengths (B,) -> logits (B, T, V), or (N, V) at ``where`` (B, T) only.

        Scoring only the masked positions saves the (B, T, V) projection during pretraining.
        """
        hidden = self.bert(input_ids, lengths)  # (B, T, D)
        if where is not None:
            hidden = hidden[where]  # (N, D)
        return self.mlm(hidden, self.bert.embeddings.word.weight)


class BertClassifier(nn.Module):
    """BERT + dropout + linear layer on the pooled sentence vector ([CLS] pooler or mean)."""

    def __init__(self, cfg: BertConfig, n_classes: int, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if n_classes < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {n_classes}")
        self.pooling = pooling
        self.bert = BertModel(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, n_classes)
        init_bert_weights(self.head)

    def forward(
        self,
        input_ids: Tensor | None,
        lengths: Tensor,
        *,
        hidden: Tensor | None = None,
        start: int = 0,
    ) -> Tensor:
        """ids (B, T), lengths (B,) -> class logits (B, C); or, with ``hidden`` (B, T, D), the
        output of the blocks below ``start`` (cached while they are frozen), no ids."""
        pooled = self.features(input_ids, lengths, hidden=hidden, start=start)  # (B, D)
        return self.head(self.dropout(pooled))  # (B, C)

    def layer_depths(self) -> dict[str, int]:
        """Each parameter's depth below the output for layer-wise lr decay: the head 0, the top
        block 1, block i of L (0-based) L − i, the embeddings L + 1; the pooler, on the output
        side of the blocks, 1."""
        L = len(self.bert.encoder.blocks)
        depths = {}
        for name, _ in self.named_parameters():
            parts = name.split(".")
            if parts[0] == "head":
                depths[name] = 0
            elif parts[:3] == ["bert", "encoder", "blocks"]:
                depths[name] = L - int(parts[3])
            elif parts[:2] == ["bert", "pooler"]:
                depths[name] = 1
            else:
                depths[name] = L + 1
        return depths

    def features(
        self,
        input_ids: Tensor | None,
        lengths: Tensor,
        *,
        hidden: Tensor | None = None,
        start: int = 0,
    ) -> Tensor:
        """The pooled vector (B, D) the head reads; arguments as :meth:`forward`'s."""
        if hidden is None:
            hidden = self.bert(input_ids, lengths)  # (B, T, D)
        else:
            hidden = self.bert.forward_from(hidden, lengths, start)  # (B, T, D)
        return self.bert.pool(hidden) if self.pooling == "cls" else mean_pool(hidden, lengths)

    def inspect(self, input_ids: Tensor, lengths: Tensor) -> dict[str, Tensor]:
        """Logits (B, C), per-layer attention (L, B, H, T, T) and each token's share (B, T) of
        the pooled vector: attention rollout (Abnar & Zuidema 2020), the product over layers of
        (head-averaged attention + identity, row-normalised), read at the [CLS] row for cls
        pooling or averaged over the real tokens' rows for mean pooling."""
        T = input_ids.shape[1]
        x = self.bert.embeddings(input_ids)  # (B, T, D)
        hidden, weights = self.bert.encoder(x, padding_mask(lengths, T), need_weights=True)
        pooled = self.bert.pool(hidden) if self.pooling == "cls" else mean_pool(hidden, lengths)
        logits = self.head(pooled)  # (B, C)
        H = self.bert.cfg.n_heads  # a pruned layer's kept heads first, the removed ones zeros
        attn = torch.stack([F.pad(w, (0, 0, 0, 0, 0, H - w.shape[1])) for w in weights])
        eye = torch.eye(T, dtype=attn.dtype, device=attn.device)
        rollout = eye.expand(input_ids.shape[0], T, T)  # (B, T, T)
        for layer in weights:  # (B, H, T, T)
            a = layer.mean(dim=1) + eye  # (B, T, T)
            rollout = (a / a.sum(dim=-1, keepdim=True)) @ rollout
        keep = padding_mask(lengths, T)[:, 0, 0, :].to(attn.dtype)  # (B, T)
        if self.pooling == "cls":
            share = rollout[:, 0]  # (B, T)
        else:
            share = (rollout * keep[:, :, None]).sum(1) / keep.sum(1, keepdim=True)  # (B, T)
        share = share * keep
        return {"logits": logits, "attention": attn, "token_share": share / share.sum(-1, True)}


register_model(
    "bert",
    family="bert",
    config=BertConfig,
    oracle="BERT",
    example=tokens(lengths=True),
    tiny={"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "context": 16},
)(BertModel)


# ---------------------------------------------------------------- Hugging Face parameter names
# What checkpoint folders hold (models.bert_folder reads them, interop.hf_bert writes them), and
# the names inside e5's packed file.


def encoder_names(cfg: BertConfig) -> dict[str, tuple[str, ...]]:
    """attnlab BertModel parameter -> the Hugging Face tensors it is made of (in row order)."""
    names: dict[str, tuple[str, ...]] = {
        "embeddings.word.weight": ("embeddings.word_embeddings.weight",),
        "embeddings.position.embedding.weight": ("embeddings.position_embeddings.weight",),
        "embeddings.token_type.weight": ("embeddings.token_type_embeddings.weight",),
    }
    pairs = {"embeddings.norm": "embeddings.LayerNorm"}
    for i in range(cfg.n_layers):
        ours, hf = f"encoder.blocks.{i}", f"encoder.layer.{i}"
        for kind in ("weight", "bias"):
            names[f"{ours}.self_attn.q_proj.{kind}"] = (f"{hf}.attention.self.query.{kind}",)
            names[f"{ours}.self_attn.kv_proj.{kind}"] = tuple(
                f"{hf}.attention.self.{part}.{kind}" for part in ("key", "value")
            )
        pairs |= {
            f"{ours}.self_attn.out_proj": f"{hf}.attention.output.dense",
            f"{ours}.norm1": f"{hf}.attention.output.LayerNorm",
            f"{ours}.ff.w_in": f"{hf}.intermediate.dense",
            f"{ours}.ff.w_out": f"{hf}.output.dense",
            f"{ours}.norm2": f"{hf}.output.LayerNorm",
        }
    for ours, hf in pairs.items():
        for kind in ("weight", "bias"):
            names[f"{ours}.{kind}"] = (f"{hf}.{kind}",)
    return names


POOLER_NAMES = {"pooler.weight": ("pooler.dense.weight",), "pooler.bias": ("pooler.dense.bias",)}
MLM_NAMES = {
    "transform.weight": ("cls.predictions.transform.dense.weight",),
    "transform.bias": ("cls.predictions.transform.dense.bias",),
    "norm.weight": ("cls.predictions.transform.LayerNorm.weight",),
    "norm.bias": ("cls.predictions.transform.LayerNorm.bias",),
    "bias": ("cls.predictions.bias",),
}
