"""ELECTRA pretraining (`attnlab train mlm --objective electra`): replaced-token labels are
right, the losses fall, and the discriminator's checkpoint fine-tunes through the classify
path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from attnlab.cli import main
from attnlab.models.electra import ElectraConfig, ElectraPretrainer, electra_losses

TRAIN = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1"]
TINY = ["--d-model", "32", "--n-layers", "2", "--n-heads", "4", "--d-ff", "64",
        "--vocab-size", "200", "--max-len", "24", "--batch-size", "16", "--lr", "2e-3",
        "--checkpoint-every", "20", *TRAIN]  # fmt: skip


def test_replaced_labels_and_shared_embeddings():
    cfg = ElectraConfig(vocab_size=30, d_model=16, n_heads=4, n_layers=1, d_ff=32, context=16,
                        dropout=0.0, attn_dropout=0.0)  # fmt: skip
    model = ElectraPretrainer(cfg, 0.5)
    assert model.generator.electra.cfg.d_model == 8 and model.generator.electra.project is not None
    gen_emb, disc_emb = model.generator.electra.embeddings, model.discriminator.electra.embeddings
    assert gen_emb is disc_emb  # one embedding table for both
    ids = torch.randint(5, 30, (3, 10))
    lengths = torch.tensor([10, 7, 4])
    where = torch.zeros(3, 10, dtype=torch.bool)
    where[0, 2] = where[1, 5] = where[2, 1] = True
    batch = {"input_ids": ids, "lengths": lengths, "where": where, "targets": ids[where]}
    torch.manual_seed(0)
    out = model(batch)
    assert not out["replaced"][~where].any()  # unmasked tokens are never "replaced"
    # a sample equal to the original counts as original: make the generator sure and right
    one = torch.zeros_like(where)
    one[0, 2] = True
    with torch.no_grad():
        model.generator.bias.fill_(-1e4)
        model.generator.bias[ids[0, 2]] = 1e4
    out = model({**batch, "where": one, "targets": ids[one]})
    assert not out["replaced"].any()
    with torch.no_grad():  # and sure and wrong
        model.generator.bias.fill_(-1e4)
        model.generator.bias[(ids[0, 2] + 1) % 30] = 1e4
    assert torch.equal(model({**batch, "where": one, "targets": ids[one]})["replaced"], one)
    parts = electra_losses(model, batch)
    assert parts["disc"].requires_grad and parts["mlm"].requires_grad


def write_corpus(root: Path, n: int = 240) -> tuple[Path, Path]:
    rng = random.Random(0)
    filler = ["the", "a", "movie", "film", "plot", "actor", "story", "was", "very", "and", "but"]
    pos, neg = (
        ["great", "wonderful", "superb", "lovely"],
        ["awful", "terrible", "boring", "dreadful"],
    )
    rows, texts = ["text,label"], []
    for i in range(n):
        label, words = ("positive", pos) if i % 2 else ("negative", neg)
        body = [rng.choice(filler) for _ in range(rng.randint(4, 12))]
        body.insert(rng.randrange(len(body) + 1), rng.choice(words))
        rows.append(f"{' '.join(body)},{label}")
        texts.append(" ".join(body))
    (root / "reviews.csv").write_text("\n".join(rows) + "\n")
    (root / "reviews.txt").write_text("\n".join(texts) + "\n")
    return root / "reviews.csv", root / "reviews.txt"


def test_pretrain_then_finetune_through_classify(tmp_path, capsys):
    csv_file, txt_file = write_corpus(tmp_path)
    run = tmp_path / "electra"
    args = ["train", "mlm", "--objective", "electra", "--data", str(txt_file), "--out", str(run)]
    args += ["--epochs", "6"]
    assert main(args + TINY + ["--generator-fraction", "0.5"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val_disc_loss"] for r in rows if "val_disc_loss" in r]
    assert evals[-1] < evals[0], evals
    assert (run / "checkpoint" / "config.json").is_file()
    out = tmp_path / "ft"
    args = ["train", "classify", "--arch", str(run), "--data", str(csv_file), "--out", str(out)]
    assert main(args + ["--epochs", "8", "--lr", "2e-3", "--batch-size", "16"] + TRAIN) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["test"]["accuracy"] >= 0.8, results["test"]
    assert main(["embed", "--arch", str(run), "a film"]) == 0
    page = tmp_path / "page.html"
    assert main(["explore", str(run), "a great film", "--out", str(page)]) == 0  # a BERT page
    assert page.stat().st_size > 1000
