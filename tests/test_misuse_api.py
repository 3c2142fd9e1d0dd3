"""The Python API under misuse: every argument of ``attnlab.load`` and of each LoadedRun verb
either works or raises attnlab's one-line UserError (the class the command line catches);
never another exception, never an empty or wrong-shaped answer."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError

sys.path.insert(0, str(Path(__file__).parent / "explore"))
import explore_runs  # noqa: E402

import _runs  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("misuse")
    return {
        "e5": _runs.e5_run(root / "e5", max_len=32),
        "char": explore_runs.classifier_run(root),
        "lm": explore_runs.gpt_run(root),
        "translate": explore_runs.translate_run(root),
    }


def refused(call: Callable[[], Any], needle: str) -> str:
    """The one-line UserError ``call`` raises, checked to contain ``needle``."""
    with pytest.raises(UserError) as err:
        call()
    message = str(err.value)
    assert needle in message and "\n" not in message, message
    return message


def test_batch_sizes_of_predict_are_whole_numbers_of_at_least_one(runs) -> None:
    clf = attnlab.load(runs["e5"])
    for size in (-3, 0):
        refused(lambda s=size: clf.predict(["好", "差"], batch_size=s), "batch_size must be >= 1")
    for size in (True, 2.5, "8"):
        refused(lambda s=size: clf.predict(["好"], batch_size=s), "batch_size must be a whole")
    for size in (True, 2.5, "8", None):
        refused(lambda s=size: attnlab.load(runs["e5"], batch_size=s), "batch_size must be")
    texts = ["好", "差", "一般"]
    for one, together in zip(clf.predict(texts, batch_size=1), clf.predict(texts), strict=True):
        assert one["text"] == together["text"] and one["label"] == together["label"]
        for label, p in together["probs"].items():
            assert abs(one["probs"][label] - p) < 1e-5  # padding changes the sums' order only


def test_a_lone_surrogate_is_read_as_the_replacement_character(runs) -> None:
    """As the command line and the server read it (data.io.clean_text)."""
    for kind in ("e5", "char"):
        clf = attnlab.load(runs[kind])
        (got,) = clf.predict(["\ud800好"])
        assert got == clf.predict(["\ufffd好"])[0] and got["text"] == "\ufffd好"
    info = attnlab.load(runs["e5"]).attention("\ud800好")
    assert info["label"] in ("negative", "positive")


def test_devices_are_checked_as_the_command_line_checks_them(runs, capsys) -> None:
    run = runs["e5"]
    refused(lambda: attnlab.load(run, device="nonsense"), "device='nonsense' is not a device")
    refused(lambda: attnlab.load(run, device="meta"), "attnlab runs on cpu, cuda or mps")
    for bad in (None, 0, ["cpu"]):
        refused(lambda d=bad: attnlab.load(run, device=d), "device must be a string")
    if not torch.cuda.is_available():
        refused(lambda: attnlab.load(run, device="cuda"), "torch sees no CUDA device")
        assert main(["serve", str(run), "--device", "cuda"]) == 2
        assert "--device cuda, but torch sees no CUDA device" in capsys.readouterr().err
    assert attnlab.load(run, device=torch.device("cpu")).predict(["好"])[0]["label"]


def test_threads_and_run_paths(runs, tmp_path) -> None:
    run = runs["e5"]
    for bad in (True, 2.5, "8", None):
        refused(lambda t=bad: attnlab.load(run, threads=t), "threads must be a whole number")
    cores = os.cpu_count() or 1
    refused(lambda: attnlab.load(run, threads=10**9), f"this machine has {cores} cores")
    refused(lambda: attnlab.load(run, threads=-1), "threads must be >= 0")
    assert attnlab.load(run, threads=cores).predict(["好"])[0]["label"]
    for bad in (None, 3, b"/tmp"):
        refused(lambda r=bad: attnlab.load(r), "the run must be a folder path")
    refused(lambda: attnlab.load(""), "empty string")
    (tmp_path / "file").write_text("x")
    refused(lambda: attnlab.load(tmp_path / "file"), "not a run directory")
    refused(lambda: attnlab.load(tmp_path / "missing"), "does not exist")


def test_texts_of_every_wrong_kind_are_refused(runs) -> None:
    clf = attnlab.load(runs["char"])
    cases = {
        "got generator": (t for t in ["好"]),
        "got set": {"好"},
        "got dict": {"好": 1},
        "got bytes": b"ab",
        "text 1 is a bytes": [b"a"],
        "text 2 is a NoneType": ["好", None],
        "text 1 is a list": [["好"]],
    }
    for needle, texts in cases.items():
        refused(lambda t=texts: clf.predict(t), needle)
    many = clf.predict(("好",) * 700)  # a tuple is a list of strings too
    assert len(many) == 700 and all(p["label"] for p in many)


def test_evaluate_names_the_splits_and_checks_its_arguments(runs) -> None:
    for kind in ("e5", "char", "translate"):
        loaded = attnlab.load(runs[kind])
        for split in ("nosuch", None, 3):
            refused(lambda s=split, r=loaded: r.evaluate(split=s), "train, val, test")
    clf = attnlab.load(runs["e5"])
    refused(lambda: clf.evaluate(data=3), "data must be a file path")
    refused(lambda: clf.evaluate(data="x.csv", text_col=1), "text_col must be a column name")
    refused(lambda: clf.evaluate(nosuch=1), "unexpected keyword argument 'nosuch'")
    refused(lambda: clf.score_file(None, "out.csv"), "data must be a file path")
    refused(lambda: clf.score_file("in.csv", 4), "out must be a file path")
    refused(lambda: clf.score_file("in.csv", "out.csv", text_col=0), "text_col must be a column")


def test_the_other_verbs_check_their_arguments(runs) -> None:
    clf = attnlab.load(runs["e5"])
    refused(lambda: clf.attention(None), "text must be a string")
    refused(lambda: clf.attention(["好"]), "text must be a string")
    refused(lambda: clf.attention("好", member=1), "member must be <= 0")
    lm = attnlab.load(runs["lm"])
    refused(lambda: lm.generate(3, 4), "prompt must be a string")
    refused(lambda: lm.generate("To", 2.5), "max_new_tokens must be a whole number")
    refused(lambda: lm.generate("To", 4, top_k=1.5), "top_k must be a whole number")
    refused(lambda: lm.generate("To", 4, temperature="hot"), "temperature must be a number")
    refused(lambda: lm.generate("To", 4, stops="be"), "stops must be a list of strings")
    assert len(lm.generate("To", 4, temperature=0.0).texts) == 1
    tr = attnlab.load(runs["translate"])
    for texts, needle in ((None, "got NoneType"), ([], "no texts"), ("the cat", "got str"),
                          ((t for t in ["cat"]), "got generator"), ([3], "text 1 is a int"),
                          (["", "cat"], "text 1 is empty")):  # fmt: skip
        refused(lambda t=texts: tr.translate(t), needle)
    refused(lambda: tr.translate(["the cat"], 2.5), "beam_size must be a whole number")
    assert len(tr.translate(["the cat", "\ud800 mat"], 1)) == 2


def test_a_verb_an_image_run_only_draws_is_one_line(tmp_path) -> None:
    run = explore_runs.vision_run(tmp_path, "vit")
    image = str(explore_runs.image_file(tmp_path))
    refused(lambda: attnlab.load(run).attention(image), "`attnlab attention")
    refused(lambda: attnlab.load(run).evaluate(split="nosuch"), "train, val, test")


def test_a_config_or_record_nested_past_the_parser_is_one_line(tmp_path):
    """config.json (or any JSON record) of brackets nested too deep for the parser is refused
    in one line, not a RecursionError."""
    from attnlab.data.io import read_json

    deep = "[" * 100_000 + "]" * 100_000
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(deep)
    with pytest.raises(UserError, match="nested too deep"):
        attnlab.load(run)
    with pytest.raises(UserError, match="nested too deep"):
        read_json(run / "config.json", "data report")
