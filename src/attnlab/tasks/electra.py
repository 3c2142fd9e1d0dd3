"""ELECTRA pretraining (`attnlab train electra`): replaced-token detection on any text.

The data, tokenizer, split and model sizes are those of `attnlab train mlm`
(:mod:`attnlab.tasks.bert_mlm`): the same texts masked the same way (15 %, 80/10/10). A small
generator (:class:`attnlab.models.electra.ElectraGenerator`, ``generator_fraction`` of the
discriminator's heads and feed-forward width, its embeddings tied to the discriminator's)
predicts the masked tokens; a token is sampled from its distribution at each masked position;
the discriminator (the model that is kept, BERT's encoder with a one-logit head) says for every
real token whether it was replaced. Loss = L_MLM(generator) + λ · L_Disc (Clark et al. 2020,
eq. 1-2, λ = ``disc_weight``); the sampling step passes no gradient to the generator.

The run's ``checkpoint/`` holds the discriminator's encoder as a Hugging Face BERT directory,
so `attnlab train classify --init RUN` fine-tunes it exactly like an MLM run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.errors import UserError
from attnlab.interop.hf_bert import save_pretrained
from attnlab.layers.attention import padding_mask
from attnlab.models.bert import BertModel
from attnlab.models.electra import (
    ElectraConfig,
    ElectraDiscriminator,
    ElectraGenerator,
    tie_embeddings,
)
from attnlab.runs.task import RunConfig, Setup
from attnlab.tasks.bert_mlm import SECTIONS, MLMData, MLMTask, Prepared
from attnlab.train import StepOutput


@dataclass
class ElectraSettings(ConfigBase):
    """The generator's size and the weight of the discriminator's loss."""

    generator_fraction: float = setting(
        0.25, "generator heads and FFN width as a share of the discriminator's", min=0.01, max=1.0
    )
    disc_weight: float = setting(50.0, "λ: weight of the replaced-token-detection loss", min=0.0)


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


def evaluator(data: MLMData, weight: float, device: str):
    """Validation losses with masks and generator samples fixed across evaluations."""

    @torch.no_grad()
    def evaluate(model: nn.Module) -> dict[str, float]:
        sums: dict[str, float] = {}
        n = 0
        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        for number, indices in enumerate(data.batches(0)):
            batch = data.collate(indices, torch.Generator().manual_seed(number))
            parts = electra_losses(model, {k: v.to(device) for k, v in batch.items()})
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
        torch.random.set_rng_state(state)
        mean = {k: v / max(n, 1) for k, v in sums.items()}
        return {
            "val_loss": mean["mlm"] + weight * mean["disc"],
            "val_mlm_loss": mean["mlm"],
            "val_disc_loss": mean["disc"],
            "val_disc_acc": mean["disc_acc"],
        }

    return evaluate


class ElectraTask(MLMTask):
    """ELECTRA pretraining: generator + discriminator, replaced-token detection."""

    name = "electra"
    archs = ()  # one architecture: the discriminator is a BERT

    def sections(self) -> dict[str, type]:
        return {**SECTIONS, "electra": ElectraSettings}

    def check(self, cfg: RunConfig) -> None:
        if cfg.model.embedding_size:
            raise UserError("embedding_size is for mlm --arch albert or deberta")

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        setup = super().setup(cfg, run_dir, resume, device)  # data, tokenizer, a BERT
        bert: BertModel = setup.prepared.model.bert
        disc_cfg = ElectraConfig(**to_dict(bert.cfg))
        model = ElectraPretrainer(disc_cfg, cfg.electra.generator_fraction)
        state = {k: v for k, v in bert.state_dict().items() if not k.startswith("pooler.")}
        model.discriminator.electra.load_state_dict(state)  # a new BERT's init, or ``init``'s
        setup.prepared.model = model
        assert setup.prepared.val_data is not None
        setup.evaluate = evaluator(setup.prepared.val_data, cfg.electra.disc_weight, device)
        return setup

    def build_model(self, cfg: RunConfig, setup: Setup) -> ElectraPretrainer:
        model: ElectraPretrainer = setup.prepared.model
        n_disc = sum(p.numel() for p in model.discriminator.parameters())
        n_gen = sum(
            p.numel() for n, p in model.generator.named_parameters() if "embeddings" not in n
        )
        setup.messages.append(
            f"model: ELECTRA discriminator {cfg.bert.n_layers} layers, d_model "
            f"{cfg.bert.d_model}, {n_disc / 1e6:.1f}M parameters; generator d_model "
            f"{model.generator.electra.cfg.d_model} (+{n_gen / 1e6:.1f}M, embeddings shared)"
        )
        return model

    def step(self, cfg: RunConfig):
        weight = cfg.electra.disc_weight

        def step(model: nn.Module, batch: dict[str, Tensor]) -> StepOutput:
            parts = electra_losses(model, batch)
            metrics = {k: float(parts[k].detach()) for k in ("mlm", "disc", "disc_acc", "gen_acc")}
            return StepOutput(
                loss=parts["mlm"] + weight * parts["disc"],
                weight=len(batch["lengths"]),
                metrics=metrics,
            )

        return step

    def finish(
        self, cfg: RunConfig, setup: Setup, model: ElectraPretrainer, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        bert = BertModel(cfg.bert)
        bert.load_state_dict(model.discriminator.electra.state_dict(), strict=False)
        checkpoint = save_pretrained(run_dir / "checkpoint", bert, prep.tokenizer, None)
        n_params = sum(p.numel() for p in model.discriminator.parameters())
        return {"n_params": n_params, "checkpoint": str(checkpoint)}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        return [f"discriminator as a Hugging Face BERT checkpoint: {results['checkpoint']}"]


TASK = ElectraTask()
