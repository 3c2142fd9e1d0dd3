"""Pretraining an encoder on any text (`attnlab train mlm`): masked LM, or ELECTRA.

Texts come from a ``.txt`` file (one text per line), a labelled CSV/TSV/JSONL file, or a named
corpus (chinese_reviews, pang_lee, imdb). They are split with the same stratified split as
fine-tuning (same seed and ratios), and only the **train** part is pretrained on; the val part
gives the validation loss and the test part is never read, so a classifier fine-tuned from this
run on the same split is not tested on text the encoder has seen.

``--arch`` names the encoder: a new one of a registered architecture (bert, albert, deberta:
a WordPiece vocabulary is trained on the train split), or a pretrained encoder whose
pretraining continues (minilm, a BERT checkpoint folder, another mlm run; through
``runs.encoders.open_encoder``). ``--objective electra`` trains ELECTRA's generator and
discriminator instead (Clark et al. 2020, :mod:`attnlab.models.electra`); the discriminator is
what the run keeps. A BERT run's folder holds ``checkpoint/``, a Hugging Face BERT directory
that `attnlab train classify --arch RUN`, `attnlab embed --arch RUN` and ``transformers`` load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.data import LabeledCorpus, LengthBucketSampler, stratified_split
from attnlab.data.io import read_utf8, write_json
from attnlab.data.mlm import MLMData
from attnlab.data.sentiment import load_corpus
from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.interop.hf_bert import save_pretrained
from attnlab.models.bert import BertConfig, BertForMaskedLM, BertModel
from attnlab.models.bert_folder import open_folder
from attnlab.models.electra import ElectraConfig, ElectraPretrainer, electra_losses
from attnlab.models.pretrained import Pretrained
from attnlab.models.registry import list_models, model_entry
from attnlab.models.zoo_mlm import ZooForMaskedLM, masked_lm
from attnlab.runs.encoders import open_encoder
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.train import StepOutput, TrainConfig, load_weights, seed_everything


@dataclass
class MLMDataConfig(ConfigBase):
    """Where the text comes from, how it is tokenised and masked, and the objective."""

    data: str = setting("chinese_reviews", "a .txt file (a text per line), CSV/TSV/JSONL or corpus")
    text_col: str = setting("text")
    label_col: str = setting("label")
    objective: Literal["mlm", "electra"] = setting(
        "mlm",
        "mlm: predict the masked tokens; electra: a small generator fills them and the encoder "
        "tells every token whether it was replaced (bert only)",
    )
    vocab_size: int = setting(8000, "WordPiece vocabulary size (a new encoder only)", min=1)
    min_frequency: int = setting(2)
    lowercase: bool = setting(True)
    max_len: int = setting(128, "tokens per text ([CLS] and [SEP] included); the rest is cut")
    mask_prob: float = setting(
        0.15, "share of tokens chosen as MLM targets (80/10/10 rule)", above=0, below=1
    )
    split_seed: int = setting(0)
    val_ratio: float = setting(0.1)
    test_ratio: float = setting(0.1)
    max_examples: int = setting(0, min=0)
    eval_batch_size: int = setting(128, min=1)


@dataclass
class MLMModelConfig(ConfigBase):
    """The size of a new encoder (a pretrained --arch brings its own architecture)."""

    d_model: int = setting(256, min=1)
    n_layers: int = setting(4, min=1)
    n_heads: int = setting(4, min=1)
    d_ff: int = setting(1024, min=1)
    dropout: float = setting(0.1, min=0, below=1)
    attn_dropout: float = setting(0.1, min=0, below=1)
    embedding_size: int = setting(
        0, "--arch albert/deberta: token embedding width; 0 = d_model", min=0
    )


@dataclass
class ElectraSettings(ConfigBase):
    """--objective electra: the generator's size and the weight of the discriminator's loss."""

    generator_fraction: float = setting(
        0.25, "generator heads and FFN width as a share of the discriminator's", min=0.01, max=1.0
    )
    disc_weight: float = setting(50.0, "λ: weight of the replaced-token-detection loss", min=0.0)


SECTIONS: dict[str, type[ConfigBase]] = {
    "data": MLMDataConfig,
    "model": MLMModelConfig,
    "train": TrainConfig,
    "electra": ElectraSettings,
}


def is_pretrained(arch: str) -> bool:
    """Whether ``--arch`` names a pretrained encoder (registered with weights, or a folder)."""
    return arch not in list_models() or model_entry(arch).pretrained


def load_texts(dcfg: MLMDataConfig) -> LabeledCorpus:
    """The corpus to pretrain on; a .txt file becomes a corpus with one dummy label."""
    if dcfg.data.endswith(".txt"):
        texts = [line.strip() for line in read_utf8(dcfg.data).splitlines() if line.strip()]
        if len(texts) < 2:
            raise UserError(f"{dcfg.data} needs at least 2 non-empty lines to pretrain on")
        return LabeledCorpus(texts, ["text"] * len(texts), source=dcfg.data)
    corpus, _ = load_corpus(dcfg.data, dcfg.text_col, dcfg.label_col,
                            max_examples=dcfg.max_examples, seed=dcfg.split_seed)  # fmt: skip
    return corpus


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
    """Cross-entropy at the selected positions; accuracy of the top prediction as a metric."""
    logits = model(batch["input_ids"], batch["lengths"], batch["where"])  # (N, V)
    loss = F.cross_entropy(logits, batch["targets"])
    acc = (logits.argmax(-1) == batch["targets"]).float().mean().item()
    return StepOutput(loss=loss, weight=len(batch["targets"]), metrics={"acc": acc})


def evaluator(data: MLMData, device: str):
    """Validation MLM loss, accuracy and perplexity with masks fixed across evaluations."""

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        for number, indices in enumerate(data.batches(0)):
            batch = data.collate(indices, torch.Generator().manual_seed(number))
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(batch["input_ids"], batch["lengths"], batch["where"])  # (N, V)
            loss_sum += F.cross_entropy(logits.float(), batch["targets"], reduction="sum").item()
            correct += (logits.argmax(-1) == batch["targets"]).sum().item()
            count += len(batch["targets"])
        loss = loss_sum / count
        return {"val_loss": loss, "val_acc": correct / count, "val_ppl": math.exp(min(loss, 50))}

    return evaluate


def electra_evaluator(data: MLMData, weight: float, device: str):
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


def electra_step(weight: float):
    """The ELECTRA loss of one micro-batch: L_MLM + λ L_Disc (Clark et al. 2020, eq. 1-2)."""

    def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
        parts = electra_losses(model, batch)
        metrics = {k: float(parts[k].detach()) for k in ("mlm", "disc", "disc_acc", "gen_acc")}
        return StepOutput(
            loss=parts["mlm"] + weight * parts["disc"], weight=len(batch["lengths"]),
            metrics=metrics,
        )  # fmt: skip

    return step


def _data(
    seqs: list[list[int]], tok: WordPieceTokenizer, dcfg: MLMDataConfig, batch: int, seed: int
) -> MLMData:
    """Length-bucketed MLM data whose batches depend only on (seed, epoch)."""
    sampler = LengthBucketSampler([len(s) for s in seqs], batch, shuffle=True, seed=seed)
    return MLMData(
        seqs,
        sampler,
        pad_id=tok.pad_id,
        mask_id=tok.mask_id,
        special_ids=tok.special_ids,
        vocab_size=tok.vocab_size,
        mask_prob=dcfg.mask_prob,
    )


def build_model(
    cfg: RunConfig, train_texts: list[str], saved: Path | None
) -> tuple[nn.Module, WordPieceTokenizer, list[str], str]:
    """(masked LM, tokenizer, notes, source): the pretrained encoder ``--arch`` names (its MLM
    head, when it has one), or a new encoder of that architecture with a WordPiece vocabulary
    trained on ``train_texts`` (the one a resumed run ``saved``)."""
    dcfg: MLMDataConfig = cfg.data
    mcfg: MLMModelConfig = cfg.model
    if is_pretrained(cfg.arch):
        encoder = open_encoder(cfg.arch)
        if not isinstance(encoder.model, BertModel) or encoder.model.cfg.packed_words:
            raise UserError(
                f"--arch {cfg.arch}: pretraining continues BERT encoders with a trainable word "
                "table (minilm, a BERT checkpoint folder, a BERT mlm run)"
            )
        model = BertForMaskedLM(encoder.model.cfg)
        model.bert.load_state_dict(encoder.model.state_dict())
        notes = list(encoder.notes)
        if encoder.mlm is not None:
            model.mlm.load_state_dict(encoder.mlm.state_dict())
        else:
            notes.append("the checkpoint has no MLM head; it starts from BERT's random init")
        return model, encoder.tokenizer, notes, encoder.name
    if saved is not None and saved.exists():
        tokenizer = WordPieceTokenizer.load(saved)
    else:
        tokenizer = WordPieceTokenizer.train(
            train_texts, dcfg.vocab_size, dcfg.min_frequency, dcfg.lowercase
        )
    shape = BertConfig(
        vocab_size=tokenizer.vocab_size,
        context=dcfg.max_len,
        pad_id=tokenizer.pad_id,
        **{k: v for k, v in to_dict(mcfg).items() if k != "embedding_size"},
    )
    return masked_lm(cfg.arch, shape, mcfg.embedding_size), tokenizer, [], f"new {cfg.arch}"


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder a pretraining model trains (ELECTRA's: the discriminator)."""
    if isinstance(model, ElectraPretrainer):
        return model.discriminator.electra
    return model.bert


@dataclass
class Prepared:
    """The tokenizer, the split texts and where the model comes from."""

    model: nn.Module
    tokenizer: WordPieceTokenizer
    report: dict[str, Any]


class MLMTask(Task):
    """Pretraining an encoder: masked LM, or ELECTRA's replaced-token detection."""

    name = "mlm"
    archs = ("bert", "albert", "deberta")  # ALBERT: a shared layer; DeBERTa: disentangled
    preset = "bert_mlm"
    preset_prefix = "bert_mlm"
    resumable = frozenset({"eval_batch_size"})
    data_paths = ("data",)

    def known_arch(self, arch: str) -> str:
        if arch in self.archs or (Path(arch).is_absolute() and arch == str(Path(arch).resolve())):
            return arch
        if arch in list_models() and model_entry(arch).pretrained:
            return arch
        path = Path(arch).expanduser()
        if not path.is_dir():
            raise UserError(
                f"unknown --arch {arch!r}: a new {', '.join(self.archs)}, or a pretrained "
                "encoder to continue (minilm, a BERT checkpoint folder, an mlm run)"
            )
        return str(path.resolve())

    def arch_help(self) -> str:
        return f"{' | '.join(self.archs)} (new) | minilm | FOLDER (continue pretraining it)"

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def derived_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        return {"bert": BertConfig}  # the architecture trained (the pretrained one's, or new)

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        dcfg: MLMDataConfig = cfg.data
        corpus = load_texts(dcfg)
        ratios = (1.0 - dcfg.val_ratio - dcfg.test_ratio, dcfg.val_ratio, dcfg.test_ratio)
        split = stratified_split(corpus.labels, ratios, dcfg.split_seed)
        if not split["val"]:
            raise UserError("the validation split is empty; set val_ratio > 0")
        texts = {name: [corpus.texts[i] for i in split[name]] for name in ("train", "val")}
        saved = run_dir / "tokenizer.json" if resume else None
        seed_everything(cfg.train.seed)  # the model is built here, with its tokenizer
        model, tokenizer, notes, source = build_model(cfg, texts["train"], saved)
        bert = model.shape if isinstance(model, ZooForMaskedLM) else model.bert.cfg
        if dcfg.max_len > bert.context:
            raise UserError(f"max_len={dcfg.max_len} exceeds the model's {bert.context} positions")
        cfg.sections["bert"] = bert
        if dcfg.objective == "electra":
            model = _electra(cfg, model)
        seqs = {
            name: [s for s in tokenizer.encode_batch(t, dcfg.max_len) if len(s) > 2]
            for name, t in texts.items()
        }
        report = {
            "source": corpus.source,
            "init_from": source,
            "objective": dcfg.objective,
            "texts": {name: len(s) for name, s in seqs.items()},
            "tokens": {name: sum(map(len, s)) for name, s in seqs.items()},
            "test_texts_excluded": len(split["test"]),
            "vocab_size": tokenizer.vocab_size,
            "notes": notes,
        }
        tcfg = cfg.train
        train_data = _data(seqs["train"], tokenizer, dcfg, tcfg.batch_size, tcfg.seed)
        val_data = _data(seqs["val"], tokenizer, dcfg, dcfg.eval_batch_size, 0)
        files = {
            "tokenizer.json": tokenizer.save,
            "data_report.json": lambda path: write_json(path, report),
        }
        message = (
            f"data: {corpus.source}; {report['texts']} texts, {report['tokens']} tokens "
            f"(test split of {len(split['test'])} excluded)"
        )
        if dcfg.objective == "electra":
            evaluate = electra_evaluator(val_data, cfg.electra.disc_weight, device)
        else:
            evaluate = evaluator(val_data, device)
        prep = Prepared(model, tokenizer, report)
        return Setup(prep, train_data, evaluate, files, [message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> nn.Module:
        # built in setup: a new BERT's vocabulary comes from the tokenizer trained there
        prep: Prepared = setup.prepared
        model, bert = prep.model, cfg.bert
        # the [CLS] pooler is not part of the loss: frozen, so that DDP expects no gradient
        # for it (it would stop on a parameter that never receives one)
        if hasattr(encoder_of(model), "pooler"):  # DeBERTa has none
            encoder_of(model).pooler.requires_grad_(False)
        n_params = sum(p.numel() for p in model.parameters())
        what = "ELECTRA discriminator" if cfg.data.objective == "electra" else cfg.arch
        setup.messages.append(
            f"model: {what}, {bert.n_layers} layers, d_model {bert.d_model}, vocab "
            f"{bert.vocab_size}, {n_params / 1e6:.1f}M parameters (with the heads)"
        )
        return model

    def step(self, cfg: RunConfig):
        if cfg.data.objective == "electra":
            return electra_step(cfg.electra.disc_weight)
        return step

    def finish(
        self, cfg: RunConfig, setup: Setup, model: nn.Module, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        if isinstance(model, ZooForMaskedLM):  # no Hugging Face BERT folder: model.safetensors
            return {"n_params": sum(p.numel() for p in model.parameters()), "checkpoint": None}
        mlm = model.mlm if isinstance(model, BertForMaskedLM) else None
        bert = BertModel(cfg.bert)
        bert.load_state_dict(encoder_of(model).state_dict(), strict=False)
        checkpoint = save_pretrained(run_dir / "checkpoint", bert, prep.tokenizer, mlm)
        n_params = sum(p.numel() for p in encoder_of(model).parameters())
        return {"n_params": n_params, "checkpoint": str(checkpoint)}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        if results["checkpoint"] is None:
            return [f"model: {run_dir / 'model.safetensors'} (explore, embed)"]
        return [f"Hugging Face checkpoint: {results['checkpoint']}"]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> MLMRun:
        model = _zoo(cfg)
        if model is None:
            return MLMRun(run_dir, cfg)
        load_weights(model, run_dir / WEIGHTS)
        tokenizer = WordPieceTokenizer.load(run_dir / "tokenizer.json")
        return ZooMLMRun(run_dir, cfg, model.to(device).eval(), tokenizer)

    def pretrained(self, run_dir: Path) -> Pretrained:
        """The run's encoder: its checkpoint/ folder, or an ALBERT / DeBERTa run's weights."""
        from attnlab.runs.load import load_run

        source = {"weights": f"{run_dir.resolve()} (an attnlab mlm run)"}
        run = load_run(run_dir)
        if isinstance(run, ZooMLMRun):
            cfg = run.config
            return Pretrained(str(run_dir.resolve()), run.model, run.tokenizer, run.max_len,
                              source, family=model_entry(cfg.arch).family,
                              embedding_size=cfg.model.embedding_size, shape=cfg.bert)  # fmt: skip
        checkpoint = run_dir / "checkpoint"
        if not (checkpoint / "config.json").is_file():
            raise UserError(f"{run_dir} has no checkpoint/ folder yet: the run has not finished")
        return open_folder(checkpoint, str(run_dir.resolve()), source)


def _zoo(cfg: RunConfig) -> ZooForMaskedLM | None:
    """A new ALBERT / DeBERTa masked LM of the run's shape; None for a BERT run."""
    if is_pretrained(cfg.arch) or cfg.data.objective == "electra":
        return None
    model = masked_lm(cfg.arch, cfg.bert, cfg.model.embedding_size)
    return model if isinstance(model, ZooForMaskedLM) else None


def _electra(cfg: RunConfig, model: nn.Module) -> ElectraPretrainer:
    """ELECTRA's generator and discriminator, the discriminator starting from ``model``'s BERT
    (a new one, or the pretrained encoder)."""
    if not isinstance(model, BertForMaskedLM):
        raise UserError("--objective electra trains a BERT discriminator; use --arch bert")
    electra = ElectraPretrainer(ElectraConfig(**to_dict(model.bert.cfg)),
                                cfg.electra.generator_fraction)  # fmt: skip
    state = {k: v for k, v in model.bert.state_dict().items() if not k.startswith("pooler.")}
    electra.discriminator.electra.load_state_dict(state)
    return electra


class MLMRun(Run):
    """A pretraining run: its checkpoint/ folder embeds sentences and seeds fine-tuning."""

    verbs = ("embed",)

    def embed(self, texts: list[str]) -> Any:
        """Sentence vectors from the run's encoder (mean pooling, unit length)."""
        from attnlab.infer.embeddings import SentenceEncoder

        return SentenceEncoder.load(self.run_dir).encode(texts)


class ZooMLMRun(MLMRun):
    """An ALBERT or DeBERTa pretraining run (``--arch``): its encoder embeds sentences (mean
    pooling, unit length, as for BERT) and opens in the explorer as a BERT page."""

    explore_page = "bert"

    def __init__(
        self, run_dir: Path, cfg: RunConfig, model: ZooForMaskedLM, tokenizer: WordPieceTokenizer
    ) -> None:
        from attnlab.infer.embeddings import SentenceEncoder

        super().__init__(run_dir, cfg)
        self.model, self.tokenizer, self.max_len = model.bert, tokenizer, cfg.data.max_len
        self.encoder = SentenceEncoder(self.model, tokenizer, self.max_len)

    def encode(self, texts: list[str]) -> Any:
        return self.encoder.encode(texts)


TASK = MLMTask()
