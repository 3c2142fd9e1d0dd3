"""Bad input the first round of probes (test_input_misuse.py) left open: a BERT checkpoint whose
side files are damaged or whose config.json asks for sizes its weights do not have, paths the
shell passed that are not UTF-8, and run files of valid JSON but the wrong shape (a vision data
report, a config's format, a checkpoint's state files).

Each probe expects one line on stderr and exit 2 (no traceback), no folder left behind, and an
earlier run unchanged (see `_cli.probe`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from _cli import TINY, probe, snapshot, write_corpus
from test_input_misuse import TINY_MLM, WORDS, damaged_checkpoint_is_refused

from attnlab.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
import explore_runs  # noqa: E402  (the explorer tests' tiny run folders)

# what Python makes of the byte \xff on the command line (surrogateescape)
NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> tuple[Path, Path]:
    """A two-step `attnlab train mlm` run (never modified) and a labelled CSV."""
    root = tmp_path_factory.mktemp("mlm")
    lines = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8)) for i in range(80)]
    (root / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = [f"{line},{'pos' if i % 2 else 'neg'}" for i, line in enumerate(lines)]
    (root / "c.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    run = root / "mlm"
    assert main(["train", "mlm", "--data", str(root / "c.txt"), "--out", str(run),
                 "--max-steps", "2", *TINY_MLM]) == 0  # fmt: skip
    return run, root / "c.csv"


# ---------------------------------------------------------------------------- BERT checkpoints


def _config(**changes: object):
    def damage(ckpt: Path) -> None:
        raw = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**raw, **changes}))

    return damage


def _vocab_txt(ckpt: Path, vocab: bytes, tokenizer_config: str | None = None) -> None:
    """The checkpoint's tokenizer as vocab.txt (and tokenizer_config.json) instead."""
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "vocab.txt").write_bytes(vocab)
    if tokenizer_config is not None:
        (ckpt / "tokenizer_config.json").write_text(tokenizer_config)


SPECIALS = b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n"

# (how the checkpoint is damaged, what the line names); each is read by `embed` and `--init`
DAMAGED = [
    (_config(vocab_size=10**12), "vocab_size"),  # would allocate terabytes before the check
    (_config(num_hidden_layers=3), "num_hidden_layers"),  # the weights hold one layer
    (_config(max_position_embeddings=10**11), "max_position_embeddings"),
    (_config(intermediate_size=10**11), "intermediate_size"),
    (lambda c: _vocab_txt(c, b"\xff\xfe[PAD]"), "vocab.txt"),
    (lambda c: _vocab_txt(c, b"[PAD]\n\xe9t\xe9\n"), "vocab.txt"),
    (lambda c: _vocab_txt(c, SPECIALS, "{bad"), "tokenizer_config.json"),
    (lambda c: _vocab_txt(c, SPECIALS, "[1]"), "tokenizer_config.json"),
]


DAMAGED_IDS = [*(f"size_{n}" for _, n in DAMAGED[:4]), "utf16", "latin1", "bad_json", "list"]


@pytest.mark.parametrize(("damage", "needle"), DAMAGED, ids=DAMAGED_IDS)
def test_a_damaged_bert_checkpoint_is_one_line(damage, needle, mlm_run, tmp_path, capsys) -> None:
    damaged_checkpoint_is_refused(mlm_run, tmp_path, capsys, damage, needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{bad", "not a valid"), ("[]", "max_seq_length (int)"),
     ('{"max_seq_length": "x"}', "max_seq_length (int)"), ('{"max_seq_length": 0}', ">= 1")],
)  # fmt: skip
def test_a_damaged_sentence_transformers_config_is_one_line(
    text, needle, mlm_run, tmp_path, capsys
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mlm_run[0] / "checkpoint", ckpt)
    (ckpt / "sentence_bert_config.json").write_text(text)
    probe(capsys, ["embed", "--arch", str(ckpt), "a movie"], "sentence_bert_config.json", needle)
    (ckpt / "sentence_bert_config.json").write_text('{"max_seq_length": 8}')
    assert main(["embed", "--arch", str(ckpt), "a movie"]) == 0  # a sound one is read


# ---------------------------------------------------------------------------- paths not UTF-8


def test_a_path_that_is_not_utf8_is_refused_before_any_folder(tmp_path, capsys) -> None:
    data = write_corpus(tmp_path / "zh.csv")
    odd = tmp_path / f"zh{NOT_UTF8}.csv"
    shutil.copy(data, odd)
    base = ["train", "classify", *TINY, "--max-steps", "1"]
    probe(capsys, [*base, "--data", str(odd), "--out", str(tmp_path / "run")], "\\xff", "UTF-8")
    probe(capsys, [*base, "--data", str(data), "--out", str(tmp_path / f"r{NOT_UTF8}")], "\\xff")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["zh.csv", odd.name])


def test_an_image_whose_name_is_not_utf8_is_refused_and_a_text_is_cleaned(tmp_path, capsys):
    run = explore_runs.vision_run(tmp_path, "vit")
    image = explore_runs.image_file(tmp_path, f"s{NOT_UTF8}.png")
    probe(capsys, ["predict", str(run), str(image)], "\\xff", "rename")
    classifier = explore_runs.classifier_run(tmp_path)
    assert main(["predict", str(classifier), "--json", f"{NOT_UTF8}好"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "\ufffd好"


# ---------------------------------------------------------------------------- run files


def _report(**changes: object):
    def damage(run: Path) -> None:
        raw = json.loads((run / "data_report.json").read_text())
        (run / "data_report.json").write_text(json.dumps({**raw, **changes}))

    return damage


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_report(image_shape=[1]), "image_shape [1]"),
        (_report(image_shape=[3, 28, 28]), "channel"),
        (_report(image_shape=[1, 30, 30]), "image_size 28"),
        (_report(classes=["a", "b"]), "classes"),
        (_report(classes=list(range(10))), "classes"),
        (_report(mean=[0.1, 0.2]), "mean and std"),
        (_report(std=["x"]), "mean and std"),
        (_report(std=[0]), "positive"),
    ],
)
def test_a_vision_data_report_that_does_not_fit_the_model_is_one_line(
    damage, needle, tmp_path, capsys
) -> None:
    run = explore_runs.vision_run(tmp_path, "vit")
    image = explore_runs.image_file(tmp_path)
    damage(run)
    before = snapshot(run)
    probe(capsys, ["predict", str(run), str(image)], "data_report.json", needle)
    assert snapshot(run) == before


@pytest.mark.parametrize("version", ["2", True, None, [2]])
def test_a_config_format_that_is_not_a_number_is_one_line(version, tmp_path, capsys) -> None:
    run = explore_runs.classifier_run(tmp_path)
    raw = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**raw, "format": version}))
    needles = ("config.json", "'format' must be", json.dumps(version))
    probe(capsys, ["predict", str(run), "好"], *needles)


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    """A finished four-step `attnlab train classify` run (never modified)."""
    root = tmp_path_factory.mktemp("classify")
    run = root / "run"
    data = write_corpus(root / "zh.csv")
    assert main(["train", "classify", "--out", str(run), "--data", str(data), *TINY,
                 "--max-steps", "4", "--eval-every", "2"]) == 0  # fmt: skip
    return run


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("state/optimizer.json", []),
        ("state/optimizer.json", {"scalars": [], "param_groups": []}),
        ("state/rng.json", []),
        ("state/rng.json", {"python": []}),
        ("state/trainer.json", []),
        ("state/trainer.json", {"loop": None, "world_size": 1, "config": {}}),
    ],
)
def test_a_checkpoint_file_of_another_shape_is_refused_before_the_resume_changes_a_file(
    name, value, classify_run, tmp_path, capsys
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(classify_run, bad)
    (bad / name).write_text(json.dumps(value))
    before = snapshot(bad)
    argv = ["train", "classify", "--out", str(bad), "--resume", "--max-steps", "6"]
    probe(capsys, [*argv, "--num-threads", "1"], name, "not a checkpoint file")
    assert snapshot(bad) == before


def test_a_metrics_line_that_is_not_an_object_is_skipped_on_resume(classify_run, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(classify_run, bad)
    with open(bad / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("[]\n7\n")
    argv = ["train", "classify", "--out", str(bad), "--resume", "--max-steps", "6"]
    assert main([*argv, "--num-threads", "1"]) == 0
    lines = (bad / "metrics.jsonl").read_text().splitlines()
    assert all(line.startswith("{") for line in lines)


def test_a_lone_surrogate_in_a_run_file_reads_as_a_replacement_character(tmp_path, capsys):
    run = explore_runs.classifier_run(tmp_path)
    labels = run / "labels.json"
    labels.write_text(labels.read_text().replace('"positive"', '"pos\\ud800"'))
    assert main(["predict", str(run), "--json", "好看"]) == 0
    assert set(json.loads(capsys.readouterr().out)["probs"]) == {"negative", "pos\ufffd"}
    assert main(["explore", str(run), "好看", "--out", str(tmp_path / "page.html")]) == 0


def test_a_translation_tokenizer_of_another_run_is_one_line(tmp_path, capsys) -> None:
    from attnlab.data.parallel import TextTokenizer

    run = explore_runs.translate_run(tmp_path)
    letters = "abcdefghijklmnopqrstuvwxyz"
    other = TextTokenizer.train([letters + " " + letters.upper()], "char", 99)
    other.save(run / "tokenizer.json")
    before = snapshot(run)
    probe(capsys, ["translate", str(run), "the cat"], "tokenizer.json", "another run")
    assert snapshot(run) == before
