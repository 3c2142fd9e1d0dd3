"""The Python API, ``attnlab.load(RUN)``: the numbers ``attnlab predict --json`` prints, for
every kind of classifier a run holds, in the order given however the texts are batched; the
other run kinds' verbs through the same door; one line for what is wrong; a light import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError

sys.path.insert(0, str(Path(__file__).parent / "explore"))
import explore_runs  # noqa: E402

import _runs  # noqa: E402

TEXTS = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓",
    "Great film, I loved it!",
    "好" * 300,  # longer than any run here reads
    "一般般，<s> 不算好 </s> 也不算差 <pad> <unk>",
    "电影前半段很无聊，但是结局让我感动",
    "差",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api")
    return {
        "char": explore_runs.classifier_run(root),
        "e5 mean": _runs.e5_run(root / "e5", "mean", max_len=48),
        "e5 cls": _runs.e5_run(root / "e5cls", "cls", max_len=48),
        "bert cls": _runs.bert_run(root / "bert", "cls"),
    }


def cli_predictions(capsys, run: Path, texts: list[str], *extra: str) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", str(run), "--json", *extra, *texts]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("kind", ["char", "e5 mean", "e5 cls", "bert cls"])
def test_predict_gives_the_cli_numbers_in_order_however_batched(runs, kind, capsys) -> None:
    run = runs[kind]
    clf = attnlab.load(run)
    got = clf.predict(TEXTS)
    assert got == cli_predictions(capsys, run, TEXTS)  # the same objects, number for number
    assert [p["text"] for p in got] == TEXTS
    assert clf.predict(TEXTS, batch_size=2) == cli_predictions(
        capsys, run, TEXTS, "--batch-size", "2"
    )
    # each text alone: the answer in its own place, whatever else shared its batch
    alone = [clf.run.predict([text])[0] for text in TEXTS]
    for batched, single in zip(clf.predict(TEXTS, batch_size=2), alone):
        assert batched["label"] == single["label"], batched["text"]
        for label, p in single["probs"].items():
            assert abs(batched["probs"][label] - p) < 1e-5, (batched["text"], label)
    assert clf.labels == sorted(clf.labels) and len(clf.labels) == 2


def test_predict_says_which_text_was_cut(runs, capsys) -> None:
    run = runs["e5 mean"]
    preds = cli_predictions(capsys, run, TEXTS)
    assert [p["truncated"] for p in preds] == [len(t) > 40 for t in TEXTS]
    assert all(p["tokens"] > 48 for p in preds if p["truncated"])
    capsys.readouterr()
    assert main(["predict", str(run), TEXTS[2], TEXTS[3]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("  warning: "), lines  # the long one only
    assert "read the first 48" in lines[2]


def test_an_image_run_predicts_through_the_same_door(tmp_path, capsys) -> None:
    run = explore_runs.vision_run(tmp_path, "vit")
    image = str(explore_runs.image_file(tmp_path))
    got = attnlab.load(run).predict([image, image])
    assert got == cli_predictions(capsys, run, [image, image])
    assert attnlab.load(run).labels == [f"class {k}" for k in range(10)]


def test_the_other_run_kinds_answer_their_own_verbs(tmp_path) -> None:
    from attnlab.runs import load_run

    lm = explore_runs.gpt_run(tmp_path)
    settings = dict(temperature=0.0, seed=3)
    ours = attnlab.load(lm).generate("To be", 12, **settings)
    assert ours.texts == load_run(lm).generate("To be", 12, **settings).texts
    translate = explore_runs.translate_run(tmp_path)
    sentences = ["the cat sat", "on the mat"]
    assert attnlab.load(translate).translate(sentences) == load_run(translate).translate(sentences)
    with pytest.raises(UserError, match="cannot predict; what it can do: generate"):
        attnlab.load(lm).predict(["x"])
    with pytest.raises(UserError, match="cannot generate; what it can do: translate"):
        attnlab.load(translate).generate("x", 3)
    with pytest.raises(AttributeError):
        attnlab.load(lm).not_a_verb  # noqa: B018


def test_bad_inputs_are_one_line_and_threads_are_restored(runs) -> None:
    clf = attnlab.load(runs["e5 mean"])
    cases = {
        "texts must be a list of strings, got str": "一段文字",
        "no texts given": [],
        "text 2 is a int, not a string": ["好", 3],
        "text 3 is empty": ["好", "差", " \u200b"],
        "texts must be a list of strings, got NoneType": None,
    }
    for needle, texts in cases.items():
        with pytest.raises(UserError) as err:
            clf.predict(texts)
        assert needle in str(err.value) and "\n" not in str(err.value)
    before = torch.get_num_threads()
    attnlab.load(runs["e5 mean"], threads=before + 1).predict(["好"])
    assert torch.get_num_threads() == before
    with pytest.raises(UserError, match="threads must be >= 0"):
        attnlab.load(runs["e5 mean"], threads=-1)
    with pytest.raises(UserError, match="batch_size must be >= 1"):
        attnlab.load(runs["e5 mean"], batch_size=0)


def test_import_attnlab_loads_no_torch() -> None:
    code = "import sys, attnlab; attnlab.load; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
