"""ELECTRA (Clark et al. 2020): pretraining by replaced-token detection.

A small generator (a masked LM) fills masked positions with sampled tokens; the discriminator
(the model that is kept) predicts for *every* token whether it was replaced (eq. 2:
L_Disc = Σ_t −1(x̃_t = x_t) log D(x̃, t) − 1(x̃_t ≠ x_t) log(1 − D(x̃, t))), and the two are
trained together on L_MLM + λ L_Disc (λ = 50). Every position carries a loss, not only the 15 %
that are masked, which is the paper's reason for its compute efficiency.

What it changes relative to attnlab's BERT (:mod:`attnlab.models.bert`):

* the embeddings may be narrower than the encoder (``embedding_size``), with a linear
  projection to ``d_model`` (:class:`ElectraModel`, ``self.project``);
* the discriminator head is dense -> activation -> one logit per token
  (:class:`ElectraDiscriminator`); the generator head is dense to the embedding width -> GELU ->
  LayerNorm -> the tied word embeddings + bias (:class:`ElectraGenerator`);
* the generator and discriminator share the token (and position, type) embeddings
  (:func:`tie_embeddings`).

The encoder itself is BERT's post-norm stack, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import setting, to_dict
from attnlab.layers.attention import padding_mask
from attnlab.layers.blocks import Block, BlockStack, apply_activation
from attnlab.models.bert import BertConfig, BertEmbeddings, init_bert_weights
from attnlab.models.registry import register_model, tokens


@dataclass
class ElectraConfig(BertConfig):
    """BERT's fields plus ``embedding_size`` (ELECTRA-small: 128 wide embeddings, d_model 256)."""

    embedding_size: int = setting(0, "width of the token embeddings; 0 = d_model", min=0)

    @property
    def emb(self) -> int:
        return self.embedding_size or self.d_model


def embedding_config(cfg: BertConfig, width: int) -> BertConfig:
    """The config of a BertEmbeddings ``width`` wide (heads play no part in embeddings)."""
    return replace(cfg, d_model=width, n_heads=1)


class ElectraModel(nn.Module):
    """ElectraModel: BERT embeddings of width E, a projection E -> D if they differ, BERT's
    encoder. Returns hidden states (B, T, D)."""

    def __init__(self, cfg: ElectraConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.embeddings = BertEmbeddings(embedding_config(cfg, cfg.emb))
        self.project = nn.Linear(cfg.emb, cfg.d_model) if cfg.emb != cfg.d_model else None
        block = cfg.block_config()
        self.encoder = BlockStack([Block(block) for _ in range(cfg.n_layers)])
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        init_bert_weights(self)

    def forward(
        self, input_ids: Tensor, lengths: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """ids (B, T) right-padded to ``lengths`` (B,) -> hidden (B, T, D)."""
        T = input_ids.shape[1]
        if self.cfg.context < T:
            raise ValueError(
                f"input has {T} tokens but this model has {self.cfg.context} positions; "
                f"truncate to context={self.cfg.context}"
            )
        mask = None if lengths is None else padding_mask(lengths, T)  # (B, 1, 1, T)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, E)
        if self.project is not None:
            x = self.project(x)  # (B, T, D)
        return self.encoder(x, mask)  # type: ignore[return-value]


class ElectraDiscriminator(nn.Module):
    """ElectraForPreTraining: per-token logit that the token was replaced (> 0 = replaced)."""

    def __init__(self, cfg: ElectraConfig) -> None:
        super().__init__()
        self.electra = ElectraModel(cfg)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.prediction = nn.Linear(cfg.d_model, 1)
        init_bert_weights(self)

    def forward(self, input_ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """ids (B, T) -> replaced-token logits (B, T)."""
        h = self.electra(input_ids, lengths)  # (B, T, D)
        h = apply_activation(self.dense(h), self.electra.cfg.activation)
        return self.prediction(h).squeeze(-1)  # (B, T)


class ElectraGenerator(nn.Module):
    """ElectraForMaskedLM: LayerNorm(GELU(W h)) (width E) · Eᵀ + b, E the tied word embeddings."""

    def __init__(self, cfg: ElectraConfig) -> None:
        super().__init__()
        self.electra = ElectraModel(cfg)
        self.dense = nn.Linear(cfg.d_model, cfg.emb)
        self.norm = nn.LayerNorm(cfg.emb, eps=cfg.norm_eps)
        self.bias = nn.Parameter(self.dense.weight.new_zeros(cfg.vocab_size))
        init_bert_weights(self)

    def forward(
        self, input_ids: Tensor, lengths: Tensor | None = None, where: Tensor | None = None
    ) -> Tensor:
        """ids (B, T) -> logits (B, T, V), or (N, V) at the positions ``where`` (B, T)."""
        h = self.electra(input_ids, lengths)  # (B, T, D)
        if where is not None:
            h = h[where]  # (N, D)
        h = self.norm(F.gelu(self.dense(h)))  # (..., E)
        return F.linear(h, self.electra.embeddings.word.weight, self.bias)  # (..., V)


def tie_embeddings(generator: ElectraGenerator, discriminator: ElectraDiscriminator) -> None:
    """Share the generator's embedding layer with the discriminator (ELECTRA §3.2)."""
    generator.electra.embeddings = discriminator.electra.embeddings


register_model(
    "electra",
    family="electra",
    config=ElectraConfig,
    oracle="ELECTRA + gradients",
    example=tokens(lengths=True),
    tiny={"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "context": 16},
)(ElectraDiscriminator)


class ElectraPretrainer(nn.Module):
    """Generator + discriminator sharing their token, position and type embeddings."""

    def __init__(self, disc_cfg: ElectraConfig, fraction: float) -> None:
        super().__init__()
        head_dim = disc_cfg.d_model // disc_cfg.n_heads
        heads = max(1, round(disc_cfg.n_heads * fraction))
        gen_cfg = ElectraConfig(
            **{
                **to_dict(disc_cfg),
                "n_heads": heads,
                "d_model": heads * head_dim,
                "d_ff": max(1, round(disc_cfg.d_ff * fraction)),
                "embedding_size": disc_cfg.emb,  # the shared embeddings' width
            }
        )
        self.discriminator = ElectraDiscriminator(disc_cfg)
        self.generator = ElectraGenerator(gen_cfg)
        tie_embeddings(self.generator, self.discriminator)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """MLM logits at the masked positions and replaced-token logits at every position."""
        ids, lengths, where = batch["input_ids"], batch["lengths"], batch["where"]
        gen_logits = self.generator(ids, lengths, where)  # (N, V)
        with torch.no_grad():
            sampled = torch.distributions.Categorical(logits=gen_logits.float()).sample()  # (N,)
        corrupted = ids.clone()
        corrupted[where] = sampled  # x̃: generator samples at the masked positions
        replaced = torch.zeros_like(where)
        replaced[where] = sampled != batch["targets"]  # a correct guess counts as original
        disc_logits = self.discriminator(corrupted, lengths)  # (B, T)
        return {"gen_logits": gen_logits, "disc_logits": disc_logits, "replaced": replaced}


def electra_losses(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Generator MLM loss, discriminator loss over real tokens, and their accuracies."""
    out = model(batch)
    real = padding_mask(batch["lengths"], batch["input_ids"].shape[1])[:, 0, 0]  # (B, T)
    disc, labels = out["disc_logits"][real], out["replaced"][real].float()  # (M,)
    return {
        "mlm": F.cross_entropy(out["gen_logits"].float(), batch["targets"]),
        "disc": F.binary_cross_entropy_with_logits(disc.float(), labels),
        "gen_acc": (out["gen_logits"].argmax(-1) == batch["targets"]).float().mean(),
        "disc_acc": ((disc > 0).float() == labels).float().mean(),
        "replaced": labels.mean(),
    }
