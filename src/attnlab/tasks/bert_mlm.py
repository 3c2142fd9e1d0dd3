"""Masked-language-model pretraining of BERT (`attnlab train mlm`) on any text.

Texts come from a ``.txt`` file (one text per line), a labelled CSV/TSV/JSONL file, or a named
corpus (chinese_reviews, pang_lee, imdb). They are split with the same stratified split as
fine-tuning (same seed and ratios), and only the **train** part is pretrained on; the val part
gives the validation MLM loss and the test part is never read, so a classifier fine-tuned from
this run on the same split is not tested on text the encoder has seen. Without ``init`` a new
BERT and a WordPiece vocabulary trained on the train split are built; with ``init`` an existing
checkpoint (and its tokenizer) continues pretraining. The run directory holds the engine's files
plus ``checkpoint/``, a Hugging Face BERT directory (BertForMaskedLM tensors) that
`attnlab train classify --init RUN`, `attnlab embed RUN` and ``transformers`` all load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.data import LabeledCorpus, LengthBucketSampler, stratified_split
from attnlab.data.io import read_utf8, write_json
from attnlab.data.mlm import MLMData
from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.interop.hf_bert import load_pretrained, resolve_checkpoint, save_pretrained
from attnlab.models.bert import BertConfig, BertForMaskedLM
from attnlab.models.zoo_mlm import ZooForMaskedLM
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.tasks.bert_classify import BertClassifyConfig, load_corpus
from attnlab.train import StepOutput, TrainConfig, load_weights, seed_everything


@dataclass
class MLMDataConfig(ConfigBase):
    """Where the text comes from, how it is tokenised and masked."""

    data: str = setting("chinese_reviews", "a .txt file (a text per line), CSV/TSV/JSONL or corpus")
    text_col: str = setting("text")
    label_col: str = setting("label")
    init: str = setting("", "checkpoint to continue from; empty = new BERT + new WordPiece")
    vocab_size: int = setting(8000, "WordPiece vocabulary size (new tokenizer only)", min=1)
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
    """The size of a new BERT (ignored with ``init``, which brings its own architecture)."""

    d_model: int = setting(256, min=1)
    n_layers: int = setting(4, min=1)
    n_heads: int = setting(4, min=1)
    d_ff: int = setting(1024, min=1)
    dropout: float = setting(0.1, min=0, below=1)
    attn_dropout: float = setting(0.1, min=0, below=1)
    embedding_size: int = setting(
        0, "--arch albert/deberta: token embedding width; 0 = d_model", min=0
    )


SECTIONS: dict[str, type[ConfigBase]] = {
    "data": MLMDataConfig,
    "model": MLMModelConfig,
    "train": TrainConfig,
}


def load_texts(dcfg: MLMDataConfig) -> LabeledCorpus:
    """The corpus to pretrain on; a .txt file becomes a corpus with one dummy label."""
    if dcfg.data.endswith(".txt"):
        texts = [line.strip() for line in read_utf8(dcfg.data).splitlines() if line.strip()]
        if len(texts) < 2:
            raise UserError(f"{dcfg.data} needs at least 2 non-empty lines to pretrain on")
        return LabeledCorpus(texts, ["text"] * len(texts), source=dcfg.data)
    fields = ("data", "text_col", "label_col", "max_examples", "split_seed")
    return load_corpus(BertClassifyConfig(**{f: getattr(dcfg, f) for f in fields}))


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
) -> tuple[BertForMaskedLM, WordPieceTokenizer, list[str], str]:
    """(model, tokenizer, notes, source): the ``init`` checkpoint, or a new BERT (ALBERT,
    DeBERTa: ``cfg.arch``) + WordPiece.

    A new WordPiece vocabulary is trained on ``train_texts`` unless a resumed run ``saved`` one.
    """
    dcfg: MLMDataConfig = cfg.data
    mcfg: MLMModelConfig = cfg.model
    arch = encoder_arch(cfg)
    if dcfg.init:
        encoder, head, tokenizer, notes = load_pretrained(dcfg.init, with_mlm=True)
        model = BertForMaskedLM(encoder.cfg)
        model.bert.load_state_dict(encoder.state_dict())
        model.mlm.load_state_dict(head.state_dict())  # type: ignore[union-attr]
        return model, tokenizer, notes, str(resolve_checkpoint(dcfg.init))
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
    if arch != "bert":
        model = ZooForMaskedLM(arch, shape, mcfg.embedding_size)  # type: ignore[arg-type]
        return model, tokenizer, [], f"new {arch}"  # type: ignore[return-value]
    return BertForMaskedLM(shape), tokenizer, [], "new"


def encoder_arch(cfg: RunConfig) -> str:
    """The encoder a run pretrains: its ``--arch``; a BERT for ELECTRA (one architecture)."""
    return cfg.arch or "bert"


@dataclass
class Prepared:
    """The tokenizer, the split texts and where the model comes from."""

    model: BertForMaskedLM
    tokenizer: WordPieceTokenizer
    report: dict[str, Any]
    val_data: MLMData | None = None  # the validation texts, masked (ELECTRA's evaluator reads it)


class MLMTask(Task):
    """Masked-language-model pretraining of BERT."""

    name = "mlm"
    archs = ("bert", "albert", "deberta")  # ALBERT: a shared layer; DeBERTa: disentangled
    preset = "bert_mlm"
    preset_prefix = "bert_mlm"
    resumable = frozenset({"eval_batch_size"})
    data_paths = ("data", "init")

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def check(self, cfg: RunConfig) -> None:
        if cfg.arch != "bert" and cfg.data.init:
            raise UserError(f"--arch {cfg.arch} trains a new model: init takes BERT checkpoints")
        if cfg.arch == "bert" and cfg.model.embedding_size:
            raise UserError("embedding_size is for --arch albert or deberta")

    def derived_sections(self) -> dict[str, type[ConfigBase]]:
        return {"bert": BertConfig}  # the architecture trained (the init checkpoint's, or new)

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
        seqs = {
            name: [s for s in tokenizer.encode_batch(t, dcfg.max_len) if len(s) > 2]
            for name, t in texts.items()
        }
        report = {
            "source": corpus.source,
            "init_from": source,
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
        prep = Prepared(model, tokenizer, report, val_data)
        return Setup(prep, train_data, evaluator(val_data, device), files, [message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> BertForMaskedLM:
        # built in setup: a new BERT's vocabulary comes from the tokenizer trained there
        prep: Prepared = setup.prepared
        model, bert = prep.model, cfg.bert
        # the [CLS] pooler is not part of the MLM loss: frozen, so that DDP expects no gradient
        # for it (it would stop on a parameter that never receives one)
        if hasattr(model.bert, "pooler"):  # DeBERTa has none
            model.bert.pooler.requires_grad_(False)
        n_params = sum(p.numel() for p in model.parameters())
        setup.messages.append(
            f"model: {encoder_arch(cfg).upper()} {bert.n_layers} layers, d_model {bert.d_model}, "
            f"vocab {bert.vocab_size}, {n_params / 1e6:.1f}M parameters"
        )
        return model

    def step(self, cfg: RunConfig):
        return step

    def finish(
        self, cfg: RunConfig, setup: Setup, model: BertForMaskedLM, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        n_params = sum(p.numel() for p in model.parameters())
        if encoder_arch(cfg) != "bert":  # no Hugging Face BERT folder: the run is model.safetensors
            return {"n_params": n_params, "checkpoint": None}
        checkpoint = save_pretrained(run_dir / "checkpoint", model.bert, prep.tokenizer, model.mlm)
        n_params = sum(p.numel() for p in model.parameters())
        return {"n_params": n_params, "checkpoint": str(checkpoint)}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        if results["checkpoint"] is None:
            return [f"model: {run_dir / 'model.safetensors'} (explore, embed)"]
        return [f"Hugging Face checkpoint: {results['checkpoint']}"]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> MLMRun:
        arch = encoder_arch(cfg)
        if arch == "bert":
            return MLMRun(run_dir, cfg)
        model = ZooForMaskedLM(arch, cfg.bert, cfg.model.embedding_size)  # type: ignore[arg-type]
        load_weights(model, run_dir / WEIGHTS)
        tokenizer = WordPieceTokenizer.load(run_dir / "tokenizer.json")
        return ZooMLMRun(run_dir, cfg, model.to(device).eval(), tokenizer)


class MLMRun(Run):
    """A pretraining run: its checkpoint/ folder embeds sentences and seeds fine-tuning."""

    verbs = ("embed",)

    def embed(self, texts: list[str]) -> Any:
        """Sentence vectors from the run's checkpoint (mean pooling, unit length)."""
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
        self.encoder = SentenceEncoder(self.model, tokenizer, self.max_len)  # type: ignore[arg-type]

    def encode(self, texts: list[str]) -> Any:
        return self.encoder.encode(texts)


TASK = MLMTask()
