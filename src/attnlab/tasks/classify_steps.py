"""The steps of `attnlab train classify` (tasks/classify.py runs them in order): how a run reads
its texts (a pretrained encoder's pieces or the character model's characters), then the recipe
of a pretrained encoder — the frozen lower blocks run once, label cleaning, the head's fit on
the frozen features (LP-FT) — and a teacher's soft labels. Each step calls the technique in
:mod:`attnlab.finetune` and writes what the run folder records and prints about it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.configs import to_dict
from attnlab.data.char_tokenizer import CharTokenizer
from attnlab.data.io import read_json, write_json
from attnlab.data.labels import check_label_counts
from attnlab.data.lengths import choose_max_len, truncation_report
from attnlab.data.prepare import TextSplits
from attnlab.data.readers import CharReader, PieceReader, Reader, dataset
from attnlab.data.sentiment import held_out_texts
from attnlab.data.splits import stratified_sample
from attnlab.data.states import StateData
from attnlab.data.turns import (
    NEGATIVE,
    POSITIVE,
    clause_pool,
    compose_turns,
    concessions,
    is_mild,
    language_of,
    neutral,
    sample_pool,
    select,
)
from attnlab.data.unlabeled import load_unlabeled
from attnlab.errors import UserError
from attnlab.finetune.cleaning import FOLDS, contradicted, out_of_fold_confidence
from attnlab.finetune.distill import SoftLabels, teacher_logits
from attnlab.finetune.features import pooled_features
from attnlab.finetune.frozen import concat, frozen_states, in_order, subset
from attnlab.finetune.probe import fit_probe, logistic_regression
from attnlab.infer.classifier import ClassifierRun
from attnlab.models.bert import BertConfig
from attnlab.models.classifier import ClassifierConfig, build_classifier
from attnlab.models.pretrained import Pretrained
from attnlab.models.zoo_mlm import encoder_classifier
from attnlab.runs import training
from attnlab.runs.encoders import open_encoder
from attnlab.runs.task import RunConfig, Setup
from attnlab.tasks.classify_plan import MIN_TURN_CLAUSES, Plan
from attnlab.train.char_mlm import pretrain_encoder
from attnlab.train.precision import inference_dtype

CLEANING_FILE = "label_cleaning.json"
TURNS_FILE = "turns.json"

Features = tuple[torch.Tensor, torch.Tensor]  # pooled features (N, D) and labels (N,)


@dataclass
class Prepared:
    """A run's texts, how it reads them, and (before training) the pretrained encoder."""

    texts: TextSplits
    reader: Reader  # what training and predict read (``max_len`` of a text)
    report: dict[str, Any]
    resume: bool  # a checkpoint will be restored: no step that its weights already hold
    run_dir: Path
    device: str
    encoder: Pretrained | None = None
    unlabeled: list[str] | None = None  # the character model's pretraining texts
    plan: Plan | None = None  # what the data is and which steps fit it


# ---------------------------------------------------------------------------- data


def encoder_prepared(
    cfg: RunConfig, texts: TextSplits, run_dir: Path, resume: bool, device: str
) -> Prepared:
    """A pretrained encoder's reader; the run's model section becomes its architecture."""
    d = cfg.data
    encoder = open_encoder(cfg.arch)
    shape: BertConfig = encoder.bert_shape
    window = min(encoder.max_len, shape.context)
    lengths = encoder.tokenizer.lengths(texts.texts("train")[0])
    max_len = min(d.truncate_len, window) or choose_max_len(
        lengths, d.len_percentile, min(d.max_truncate_len, window)
    )
    attn_dropout = d.dropout if d.attn_dropout is None else d.attn_dropout
    cfg.sections["model"] = BertConfig(
        **{**to_dict(shape), "dropout": d.dropout, "attn_dropout": attn_dropout}
    )
    report = {
        **texts.report,
        "encoder": {"name": encoder.name, "family": encoder.family,
                    "embedding_size": encoder.embedding_size, **encoder.source},  # fmt: skip
        "notes": encoder.notes,
        "vocab_size": encoder.tokenizer.vocab_size,
        "max_len": max_len,
        # predict reads what training read: positions past it were never trained, and reading
        # on lowered held-out accuracy on long texts (results/read_length.md)
        "read_len": max_len,
        "truncation": str(truncation_report(lengths, max_len)),
    }
    reader = PieceReader(encoder.tokenizer, max_len)
    return Prepared(texts, reader, report, resume, run_dir, device, encoder)


def char_prepared(
    cfg: RunConfig, texts: TextSplits, run_dir: Path, resume: bool, device: str
) -> Prepared:
    """The character vocabulary (built from the training texts, or the run's own on resume)
    and the truncation length; the model section gets the vocabulary and classes."""
    d = cfg.data
    add_cls = cfg.model.pooling == "cls"
    train_texts = texts.texts("train")[0]
    unlabeled, unlabeled_report = None, {}
    if resume and (run_dir / "tokenizer.json").exists():
        tokenizer = CharTokenizer.load(run_dir / "tokenizer.json")
        max_len = read_json(run_dir / "data_report.json", "data report",
                            keys={"max_len": int})["max_len"]  # fmt: skip
    else:
        if d.pretrain_names:  # read for the vocabulary and the pretraining
            main = train_texts[: texts.n_main]
            held = {t for name in ("val", "test") for t in texts.texts(name)[0]}
            unlabeled, unlabeled_report = load_unlabeled(d.pretrain_names, main, held,
                                                         d.pretrain_len)  # fmt: skip
        tokenizer = CharTokenizer.build(train_texts + (unlabeled or []), min_freq=d.min_freq)
        lengths = [len(t) + int(add_cls) for t in train_texts[: texts.n_main]]
        max_len = d.truncate_len or choose_max_len(lengths, d.len_percentile, d.max_truncate_len)
    m: ClassifierConfig = cfg.model
    m.vocab_size, m.n_classes = tokenizer.vocab_size, len(texts.labels)
    if m.pos == "learned" and m.context < max_len:
        raise UserError(
            f"--context {m.context} is shorter than the texts' truncation length {max_len} "
            f"(max_len), and learned positions stop at the context: give --context {max_len} or "
            f"more, or --truncate-len {m.context} to cut the texts to it"
        )
    m.context = max(m.context, max_len)  # other position kinds read any length
    lengths = [len(t) + int(add_cls) for t in train_texts[: texts.n_main]]
    report = {
        **texts.report,
        "vocab_size": tokenizer.vocab_size,
        "max_len": max_len,
        "truncation": str(truncation_report(lengths, max_len)),
        **({"pretraining": unlabeled_report} if unlabeled_report else {}),
    }
    reader = CharReader(tokenizer, max_len, add_cls, d.tail_share)
    return Prepared(texts, reader, report, resume, run_dir, device, None, unlabeled)


def report_lines(prep: Prepared) -> list[str]:
    """The data report as printed before training."""
    r = prep.report
    sizes = ", ".join(f"{k} {v}" for k, v in r["split_sizes"].items())
    lines = [f"data: {r['source']}; {sizes}"]
    extra = r.get("extra_training")
    if extra:
        names = ", ".join(f"{name} ({src['n']})" for name, src in extra["sources"].items())
        lines.append(f"extra training examples: {extra['added']} from {names} (--extra-train)")
    if r.get("rare_labels"):
        lines.append(f"rare classes allowed: {r['rare_labels']}")
    unit = prep.reader.unit
    read = r.get("read_len", r["max_len"])
    read = "; predict reads the same" if read == r["max_len"] else f"; predict reads up to {read}"
    lines.append(f"vocab {r['vocab_size']} {unit}; training reads {r['max_len']} {unit} a text "
                 f"({r['truncation']}){read}")  # fmt: skip
    return lines


# ---------------------------------------------------------------------------- recipe steps


def char_model(cfg: RunConfig, setup: Setup) -> nn.Module:
    """The character model, its encoder first pretrained on masked characters when asked."""
    model = build_classifier(cfg.model)
    prep: Prepared = setup.prepared
    d = cfg.data
    if prep.unlabeled and not prep.resume:
        if cfg.model.members > 1:
            raise UserError("pretraining works on one model: give --members 1 with --pretrain")
        model.to(prep.device)
        prep.report["pretraining"]["run"] = pretrain_encoder(
            model, prep.unlabeled, prep.reader.tokenizer, steps=d.pretrain_steps,
            batch_size=cfg.train.batch_size, lr=d.pretrain_lr, max_len=d.pretrain_len,
            mask_prob=d.pretrain_mask, seed=cfg.train.seed, device=prep.device, log=training.say,
        )  # fmt: skip
    m = cfg.model
    n_params = sum(p.numel() for p in model.parameters())
    setup.messages.append(
        f"model: {n_params / 1e6:.2f}M parameters, {m.n_layers} layers, d_model {m.d_model}, "
        f"{m.n_heads} heads, pos {m.pos}, pooling {m.pooling}, {m.norm_position}-norm"
        + (f"; {m.members} such models, an ensemble" if m.members > 1 else "")
    )
    return model


def pretrained_classifier(cfg: RunConfig, prep: Prepared) -> nn.Module:
    """The classifier over the pretrained encoder, its weights copied in (with ``pretrained``;
    what the checkpoint lacks, e5's pooler, keeps this run's seeded init)."""
    d, encoder = cfg.data, prep.encoder
    assert encoder is not None
    model = encoder_classifier(cfg.model, len(prep.texts.labels), d.pooling, encoder.family,
                               encoder.embedding_size)  # fmt: skip
    if d.pretrained:
        state = {k: v for k, v in encoder.model.state_dict().items() if k not in encoder.fresh}
        missing, unexpected = model.bert.load_state_dict(state, strict=False)
        if unexpected or set(missing) - set(encoder.fresh):
            raise RuntimeError(f"the encoder does not fit: {missing} {unexpected}")
    return model


def keep_states(
    cfg: RunConfig, prep: Prepared, model: nn.Module, train: Any, val: Any, start: int
) -> tuple[StateData, StateData, dict[str, Any]]:
    """The training and validation data as the frozen lower blocks' output (blocks below
    ``start``), computed here once, and the step's record."""
    batch, tcfg = cfg.data.eval_batch_size, cfg.train
    began = time.perf_counter()
    train = frozen_states(model, in_order(train, batch), start, tcfg.batch_size, True,
                          tcfg.seed, prep.device, "frozen blocks, training texts")  # fmt: skip
    val = frozen_states(model, val, start, batch, False, 0, prep.device,
                        "frozen blocks, validation")  # fmt: skip
    seconds, nbytes = time.perf_counter() - began, train.nbytes() + val.nbytes()
    record = {"blocks": start, "bytes": nbytes, "seconds": round(seconds, 1),
              "train": len(train), "val": len(val), "layers": cfg.model.n_layers}  # fmt: skip
    return train, val, record


def features(cfg: RunConfig, prep: Prepared, model: nn.Module, train: Any) -> Features:
    """The pretrained encoder's pooled features (N, D) and labels (N,) of every training text,
    in order (from the kept lower-block states when ``train`` holds them), in the precision
    of :func:`features_dtype`."""
    data = subset(train, list(range(len(train.labels))), cfg.data.eval_batch_size, False, 0)
    return pooled_features(model, data, prep.device, features_dtype(cfg, prep))


def features_dtype(cfg: RunConfig, prep: Prepared) -> torch.dtype | None:
    """The autocast dtype of the frozen features' pass. Where every block trains they are only
    the head's start: the precision training will take, where the device computes it natively.
    The top blocks' recipe keeps float32: its label cleaning, turns and probe were chosen on
    float32 features, and with bf16 ones the main job's validation read 0.847 / 0.846 (seeds 0,
    1) against 0.850-0.851 over five seeds (docs/results/main_job_recheck.md)."""
    if 0 < cfg.data.train_layers < cfg.model.n_layers:
        return None
    return inference_dtype(prep.device, cfg.train.precision)


def clean_labels(
    cfg: RunConfig, prep: Prepared, train: Any, feats: Features | None
) -> tuple[Any, list[int], dict[str, Any]]:
    """The training data without the texts whose label the rest of the data contradicts, the
    positions kept, and the record (label_cleaning.json lists the dropped texts; a run resumed
    from a checkpoint reads that list back, ``feats`` None)."""
    d = cfg.data
    texts, ids = prep.texts.split_data("train")
    n, path = len(ids), prep.run_dir / CLEANING_FILE
    if feats is None:
        record = read_json(path, "label cleaning record", keys={"dropped": list, "n": int})
        dropped = {row.get("index") for row in record["dropped"] if isinstance(row, dict)}
        if record["n"] != n or not all(isinstance(i, int) and 0 <= i < n for i in dropped):
            raise UserError(f"{path} does not describe this run's {n} training texts; restore "
                            "it, or train again in a new folder")  # fmt: skip
    else:
        p = out_of_fold_confidence(*feats, len(prep.texts.labels), d.probe_weight_decay,
                                   d.split_seed)  # fmt: skip
        order = contradicted(p, d.clean_labels, n if d.clean_extra_train else prep.texts.n_main)
        dropped = set(order)
        names = prep.texts.labels.labels
        record = {"threshold": d.clean_labels, "folds": FOLDS, "n": n, "dropped": [
            {"index": i, "text": texts[i], "label": names[ids[i]], "p_label": round(float(p[i]), 4)}
            for i in order
        ]}  # fmt: skip
    kept = [i for i in range(n) if i not in dropped]
    try:
        check_label_counts([prep.texts.labels.labels[ids[i]] for i in kept], d.allow_rare_labels)
    except UserError as err:
        raise UserError(
            f"label cleaning at p {d.clean_labels:g} dropped {len(dropped)} of {n} training "
            f"texts: {err}; or give a lower --clean-labels"
        ) from None
    train = subset(train, kept, cfg.train.batch_size, True, cfg.train.seed)
    return train, kept, record


def cleaning_line(record: dict[str, Any], n_main: int) -> str:
    dropped = record["dropped"]
    extra = sum(row["index"] >= n_main for row in dropped if isinstance(row, dict))
    return (
        f"label cleaning: {len(dropped)} of {record['n']} training texts dropped, their label "
        f"below p {record.get('threshold', 0):g} under a probe fitted on the other folds "
        f"({extra} of them extra_train); listed in {CLEANING_FILE}"
    )


def add_turns(
    cfg: RunConfig,
    prep: Prepared,
    model: nn.Module,
    train: Any,
    feats: Features | None,
    pair: dict[str, str],
    required: bool,
) -> tuple[Any, dict[str, Any] | None]:
    """The training data with the turned sentences (data/turns.py) after it, and their record:
    clauses of the corpus's own training texts, kept where a probe on ``feats`` (the frozen
    features of every training text, ``train``'s order) confirms their text's label, composed
    a negative and a positive side around a turn word, labelled with the data's own names in
    ``pair``. A run resumed from a checkpoint reads them back (``feats`` None). When the probe
    confirms too few clauses the step is skipped ((train, None)), or refused when the run
    asked for turns (``required``)."""
    d = cfg.data
    names = prep.texts.labels.labels
    path = prep.run_dir / TURNS_FILE
    if feats is None:
        record = read_json(path, "turned sentences record", keys={"texts": list, "labels": list})
        texts, labels = record["texts"], record["labels"]
        if len(texts) != d.turns or not set(labels) <= set(names) or len(labels) != len(texts):
            raise UserError(f"{path} does not hold this run's {d.turns} turned sentences; "
                            "restore it, or train again in a new folder")  # fmt: skip
    else:
        record = scored_turns(cfg, prep, model, feats, pair, required)
        if record is None:
            return train, None
        texts, labels = record["texts"], record["labels"]
    data = dataset(prep.reader, texts, prep.texts.labels.encode(labels), d.eval_batch_size)
    if isinstance(train, StateData):
        data = frozen_states(model, data, train.start, d.eval_batch_size, False, 0, prep.device,
                             "frozen blocks, turned sentences")  # fmt: skip
    before = len(train.labels)
    train = concat(train, data, cfg.train.batch_size, True, cfg.train.seed)
    record["share_of_training"] = round(len(texts) / (before + len(texts)), 4)
    return train, record


def turns_line(record: dict[str, Any]) -> str:
    return (
        f"turns: {len(record['texts'])} sentences composed from the training texts' clauses "
        f"join the training data ({record['share_of_training']:.1%} of it); listed in "
        f"{TURNS_FILE}"
    )


def scored_turns(
    cfg: RunConfig,
    prep: Prepared,
    model: nn.Module,
    feats: Features,
    pair: dict[str, str],
    required: bool,
) -> dict[str, Any] | None:
    """The record of ``--turns`` composed sentences: the corpus's training clauses scored by a
    probe on the frozen features of its training texts, those at ``turn_threshold`` kept
    (None: too few kept, and not ``required``)."""
    d = cfg.data
    texts, ids = prep.texts.split_data("train")
    n_main, names = prep.texts.n_main, prep.texts.labels.labels
    polarity = {name: side for side, name in pair.items()}  # the data's label -> its side
    language, _ = language_of(texts[:n_main])
    assert language is not None  # the plan turns the step off otherwise
    every = clause_pool(texts[:n_main], [polarity[names[i]] for i in ids[:n_main]], language)
    pool = sample_pool(every, d.turn_clauses, d.split_seed)
    scored = list(pool)
    if d.turn_concessions:  # the mild clauses are few: every one is scored, sampled or not
        sampled = {c.text for c in pool}
        scored += [c for c in every if c.text not in sampled and is_mild(c.text, language)]
    x, y = feats[0][:n_main], feats[1][:n_main]  # every training text of the corpus, cleaned or not
    scorer = logistic_regression(x, y, len(names), d.probe_weight_decay)
    clause_ids = prep.texts.labels.encode([pair[c.label] for c in scored])
    data = dataset(prep.reader, [c.text for c in scored], clause_ids, d.eval_batch_size)
    cx, cy = pooled_features(model, data, prep.device, features_dtype(cfg, prep))
    with torch.no_grad():
        p = torch.softmax(scorer(cx.double()), -1)[torch.arange(len(cy)), cy]  # (N,)
    conceded = concessions(scored, p.tolist(), language) if d.turn_concessions else []
    p = p[: len(pool)]
    kept = select(pool, p.tolist(), d.turn_threshold)
    sides = Counter(c.label for c in kept)
    if min(sides[NEGATIVE], sides[POSITIVE]) < MIN_TURN_CLAUSES:
        why = (f"the probe confirms {sides[NEGATIVE]} negative and {sides[POSITIVE]} positive "
               f"of {len(pool)} clauses at p >= {d.turn_threshold:g}")  # fmt: skip
        if required:
            sampled = d.turn_clauses and len(pool) == d.turn_clauses
            more = ", a larger --turn-clauses" if sampled else ""
            fix = f"give a lower --turn-threshold{more} or --turns 0"
            raise UserError(f"--turns {d.turns}: {why}; {fix}")
        training.say(f"turns: skipped: {why}")
        return None
    openers = neutral(pool, p.tolist()) if d.turn_neutral else []
    held = held_out_texts(prep.texts.corpus, prep.texts.split) | set(texts)
    turns = compose_turns(kept, d.turns, d.split_seed, language, held_out=held,
                          neutral_first=openers, neutral_share=d.turn_neutral,
                          conceded=conceded, concession_share=d.turn_concessions)  # fmt: skip
    return {
        "n": d.turns,
        "language": language,
        "threshold": d.turn_threshold,
        **({"neutral_share": d.turn_neutral, "clauses_neutral": len(openers),
            "neutral_clauses": openers} if d.turn_neutral else {}),  # fmt: skip
        **({"concession_share": d.turn_concessions,
            "clauses_mild": dict(Counter(c.label for c in conceded)),
            "mild_clauses": [[c.text, c.label] for c in conceded]}
           if d.turn_concessions else {}),  # fmt: skip
        "clauses_scored": len(pool),
        "clauses_kept": dict(Counter(c.label for c in kept)),
        "source": turns.source,
        "texts": turns.texts,
        "labels": [pair[y] for y in turns.labels],
    }


def probe(
    cfg: RunConfig, head: nn.Linear, feats: Features, kept: list[int]
) -> dict[str, Any]:
    """LP-FT: ``head`` set to the logistic regression on the frozen features ``feats`` of a
    stratified sample of the training texts at ``kept``; returns the fit's record."""
    d = cfg.data
    labels = [int(feats[1][i]) for i in kept]
    sample = [kept[j] for j in stratified_sample(labels, d.probe_examples, d.split_seed)]
    return fit_probe(head, feats[0][sample], feats[1][sample], d.probe_weight_decay)


def probe_line(record: dict[str, Any]) -> str:
    return (
        f"probe: head fitted on the frozen encoder's features of {record['n']} training "
        f"examples (train accuracy {record['train_accuracy']:.4f})"
    )


def record(prep: Prepared, setup: Setup, records: dict[str, Any]) -> None:
    """What the recipe's steps did, into the data report, the run's files and the lines
    printed before training."""
    r = records.get("frozen_states")
    if r is not None:
        prep.report["frozen_states"] = {k: r[k] for k in ("blocks", "bytes", "seconds")}
        setup.messages.append(
            f"frozen: the embeddings and blocks 1-{r['blocks']} ran once over {r['train']} "
            f"training and {r['val']} validation texts ({r['seconds']:.0f} s); their output is "
            f"kept ({r['bytes'] / 2**20:.0f} MiB) and each step runs blocks {r['blocks'] + 1}-"
            f"{r['layers']}"
        )
    r = records.get("label_cleaning")
    if r is not None:
        if not prep.resume:
            setup.files[CLEANING_FILE] = lambda out, r=r: write_json(out, r)
        extra = sum(row["index"] >= prep.texts.n_main for row in r["dropped"]
                    if isinstance(row, dict))  # fmt: skip
        prep.report["label_cleaning"] = {"threshold": r.get("threshold"),
                                         "dropped": len(r["dropped"]),
                                         "dropped_extra_train": extra}  # fmt: skip
        setup.messages.append(cleaning_line(r, prep.texts.n_main))
    r = records.get("turns")
    if r is not None:
        if not prep.resume:
            setup.files[TURNS_FILE] = lambda out, r=r: write_json(out, r)
        prep.report["turns"] = {k: v for k, v in r.items() if k not in ("texts", "labels")}
        setup.messages.append(turns_line(r))
    r = records.get("probe")
    if r is not None:
        prep.report["probe"] = r
        setup.messages.append(probe_line(r))


def attach_teacher(cfg: RunConfig, setup: Setup) -> None:
    """Distillation: the teacher run's logits for every training text ride in each batch."""
    from attnlab.runs.load import load_run

    prep: Prepared = setup.prepared
    d = cfg.distill
    teacher = load_run(d.teacher)
    if not isinstance(teacher, ClassifierRun):
        raise UserError(f"{d.teacher} holds a {teacher.task!r} run, not a classifier")
    if list(teacher.labels.labels) != list(prep.texts.labels.labels):
        raise UserError(
            f"the teacher's classes {teacher.labels.labels} differ from the data's "
            f"{prep.texts.labels.labels}; distil on the data the teacher was trained for"
        )
    texts, _ = prep.texts.split_data("train")
    logits = teacher_logits(teacher, texts, d.teacher_batch_size)
    setup.train_data = SoftLabels(setup.train_data, logits)
    setup.messages.append(f"distillation: teacher {d.teacher}, T = {d.temperature}, α = {d.alpha}")
