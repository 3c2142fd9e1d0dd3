"""ALBERT and DeBERTa as runs (`attnlab train mlm --arch albert|deberta`): pretrained on a tiny
synthetic corpus, loaded by `explore` (the BERT page) and `embed`, then fine-tuned with
`train classify --init RUN` into classifiers that `predict`, `eval` and `explore` take."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.models.albert import AlbertModel
from attnlab.models.deberta import DebertaModel

TINY = [
    "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64",
    "--embedding-size", "16", "--vocab-size", "120", "--min-frequency", "1", "--max-len", "24",
    "--batch-size", "16", "--lr", "3e-3", "--warmup-ratio", "0", "--epochs", "3",
    "--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
]  # fmt: skip
WORDS = ["the", "a", "movie", "film", "plot", "was", "very", "great", "awful", "and", "but"]


def write_texts(root: Path, n: int = 160) -> Path:
    """Texts (``texts.txt``) and the same texts labelled by their last sentiment word (csv)."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n)]
    lines = [f"{line} {'great' if i % 2 else 'awful'}" for i, line in enumerate(lines)]
    rows = [f"{line},{'pos' if i % 2 else 'neg'}" for i, line in enumerate(lines)]
    (root / "texts.txt").write_text("\n".join(lines) + "\n")
    (root / "texts.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    return root / "texts.txt"


@pytest.mark.parametrize("arch", ["albert", "deberta"])
def test_zoo_mlm_run_trains_explores_and_embeds(
    arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / arch
    args = ["train", "mlm", "--arch", arch, "--data", str(write_texts(tmp_path)), "--out", str(run)]
    assert main(args + TINY) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in records if r["split"] == "val"]
    assert len(val) == 3 and val[-1] < val[0], val  # it learns
    assert not (run / "checkpoint").exists()  # not a BERT folder: the run is model.safetensors

    from attnlab.explore.sources import load_source
    from attnlab.explore.text import bert_examples

    source = load_source(run)
    encoder = source.run.model
    assert source.kind == "bert"
    assert isinstance(encoder, AlbertModel if arch == "albert" else DebertaModel)
    if arch == "albert":  # one block, applied at every depth
        assert not any(".1." in name for name, _ in encoder.named_parameters())
    page = bert_examples(source, ["the movie was great", "a plot"])
    group = page["examples"][0]["groups"][0]
    assert group["layers"] == 2 and group["heads"] == 2, {k: group[k] for k in ("layers", "heads")}
    assert main(["explore", str(run), "the film", "--out", str(tmp_path / "p.html")]) == 0

    capsys.readouterr()
    assert main(["embed", "--arch", str(run), "the film", "a plot"]) == 0
    vectors = [json.loads(line)["vector"] for line in capsys.readouterr().out.splitlines()]
    assert len(vectors) == 2 and len(vectors[0]) == 32
    assert abs(torch.tensor(vectors[0]).norm().item() - 1) < 1e-5

    tuned = tmp_path / f"{arch}-classify"
    args = ["train", "classify", "--arch", str(run), "--data", str(tmp_path / "texts.csv")]
    args += ["--out", str(tuned), "--max-steps", "4", "--batch-size", "16", *TINY[-6:]]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["predict", str(tuned), "--json", "the film was great"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("pos", "neg")
    assert main(["eval", str(tuned), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] >= 0.0
    tuned_source = load_source(tuned)
    assert isinstance(tuned_source.run.model.bert, type(encoder))
    assert main(["explore", str(tuned), "the film", "--out", str(tmp_path / "q.html")]) == 0


def test_electra_and_embedding_size_refuse_the_other_architectures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(write_texts(tmp_path, 20))
    out = ["--out", str(tmp_path / "x")]
    argv = ["train", "mlm", "--objective", "electra", "--arch", "deberta", "--data", data, *out]
    assert main(argv) == 2
    assert "--objective electra trains a BERT discriminator" in capsys.readouterr().err
    assert main(["train", "mlm", "--embedding-size", "8", "--data", data, *out]) == 2
    assert "embedding_size is for --arch albert or deberta" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_what_a_folder_holds_is_read_from_its_config(tmp_path: Path, monkeypatch) -> None:
    """`classify --arch DIR` and `embed --arch DIR` take DIR for an attnlab run by the task and
    architecture its config.json records, however the JSON is spaced; a Hugging Face
    checkpoint (a config.json that names no task) goes to the checkpoint reader."""
    from attnlab.runs import encoders
    from attnlab.runs import load as run_load
    from attnlab.runs.training import build_config
    from attnlab.tasks.bert_mlm import MLMTask

    def folder(name: str, raw: dict, **dump: object) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(raw, **dump))  # type: ignore[arg-type]
        return str(tmp_path / name)

    albert = build_config("mlm", None, {"arch": "albert"}).to_json()
    albert["bert"] = {}
    compact = folder("compact", albert, separators=(",", ":"))  # no '"arch": "' in its text
    spaced = folder("spaced", albert, indent=2)
    bert = folder("bert", build_config("mlm", None, {}).to_json())
    hf = folder("hf", {"model_type": "bert", "arch": "albert", "note": '"arch": "albert"'})
    assert run_load.recorded(compact) == run_load.recorded(spaced) == ("mlm", "albert")
    assert run_load.recorded(bert) == ("mlm", "bert")
    assert run_load.recorded(hf) is None and run_load.recorded(tmp_path / "none") is None
    monkeypatch.setattr(MLMTask, "pretrained", lambda self, path: f"run {Path(path).name}")
    monkeypatch.setattr(encoders, "open_folder", lambda path, name: f"folder {Path(path).name}")
    monkeypatch.setattr(encoders, "_with_role", lambda encoder, role: encoder)
    assert encoders.open_encoder(compact) == "run compact"
    assert encoders.open_encoder(spaced) == "run spaced"
    assert encoders.open_encoder(hf) == "folder hf"
