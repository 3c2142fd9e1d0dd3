"""``attnlab eval``: score a trained classifier on its own test split or on a labelled file."""

from __future__ import annotations

from pathlib import Path

from attnlab.data import ClassificationData, LengthBucketSampler, check_labels, load_labeled_file
from attnlab.metrics import classification_report
from attnlab.tasks.classify import ClassifierRun, make_dataset, prepare


def evaluate_run(
    run_dir: str | Path,
    data: str | None = None,
    split: str = "test",
    text_col: str | None = None,
    label_col: str | None = None,
) -> dict:
    """Classification report (accuracy, macro-F1, per class, confusion matrix) of a run."""
    from attnlab.tasks.classify import predict_dataset

    run = ClassifierRun.load(run_dir)
    dcfg = run.config.data
    batch_size = dcfg.eval_batch_size
    if data is None:
        prep = prepare(run.config, Path(run_dir), resume=True)  # the run's saved split
        if not prep.split[split]:
            raise ValueError(f"the run's {split} split is empty; pass --data FILE to evaluate on")
        dataset = make_dataset(prep, split, run.add_cls, batch_size, False, 0)
        source = f"{prep.corpus.source} ({split} split)"
    else:
        corpus = load_labeled_file(data, text_col or dcfg.text_col, label_col or dcfg.label_col)
        check_labels(run.labels.labels, corpus.labels, f"{data}", corpus.origins)
        seqs = [run.encode_text(t) for t in corpus.texts]
        sampler = LengthBucketSampler([len(s) for s in seqs], batch_size, shuffle=False)
        dataset = ClassificationData(seqs, run.labels.encode(corpus.labels), sampler)
        source = str(data)
    y_true, y_pred, loss = predict_dataset(run.model, dataset)
    report = classification_report(y_true, y_pred, run.labels.labels)
    report["loss"] = loss
    report["source"] = source
    return report
