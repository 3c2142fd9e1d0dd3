"""`attnlab bench`, `verify` and `generate`: each runs end to end on a tiny input, and each
option that another makes unused, or an output path that names no file the user asked for, is
refused in one line before anything runs or is written."""

from __future__ import annotations

import json

import pytest
from _cli import probe, snapshot

from attnlab.cli import main


def test_bench_writes_its_report_and_data_inside_an_out_folder(tmp_path, capsys) -> None:
    out = tmp_path / "reports"
    argv = ["bench", "--quick", "--only", "mha", "--num-threads", "1", "--out", f"{out}/"]
    assert main(argv) == 0, capsys.readouterr().err  # "DIR/": a folder, made for the report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]
    assert sorted(p.name for p in out.iterdir()) == ["bench-report.json", "bench-report.md"]
    assert "nn.MultiheadAttention" in (out / "bench-report.md").read_text()
    assert "mha" in json.loads((out / "bench-report.json").read_text())["sections"]


def test_bench_refuses_an_out_that_names_no_markdown_file(tmp_path, capsys) -> None:
    (tmp_path / "file.txt").write_text("mine\n")
    (tmp_path / "r.json").mkdir()
    before = snapshot(tmp_path)
    for out, needle in (
        ("r.txt", "the report is markdown"),  # r.md would be written, not r.txt
        ("file.txt/r.md", "file.txt is a file"),
        ("r", "r.json is a folder"),  # the data of r.md goes to r.json
    ):
        probe(capsys, ["bench", "--quick", "--only", "mha", "--out", str(tmp_path / out)], needle)
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "file.txt",
        "r.json",
    ]


@pytest.mark.parametrize("verb", ["bench", "verify"])
def test_negative_threads_are_refused_as_training_refuses_them(verb, tmp_path, capsys) -> None:
    small = ["--quick", "--only", "mha", "--out", str(tmp_path / "r.md")]  # quick if accepted
    small = small if verb == "bench" else ["--only", "scaled_dot"]
    line = probe(capsys, [verb, "--num-threads", "-2", *small], "--num-threads must be >= 0")
    assert "got -2" in line and list(tmp_path.iterdir()) == []


def test_verify_runs_end_to_end_and_writes_its_json_table(tmp_path, capsys) -> None:
    out = tmp_path / "table.json"
    argv = ["verify", "--only", "scaled_dot", "--seed", "3", "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert "passed" in capsys.readouterr().out
    table = json.loads(out.read_text())
    assert table["meta"]["seed"] == 3
    rows = {r["component"]: r["status"] for r in table["rows"]}
    assert rows["scaled_dot_product_attention"] == "pass" and set(rows.values()) == {"pass"}


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--lookahead", "3"], ["--lookahead 3 would be ignored", "--draft RUN"]),
        (["--prompt-lookup", "--no-cache"], ["--no-cache would be ignored", "speculative"]),
        (["--temperature", "0", "--top-k", "40"], ["--top-k 40 would be ignored", "greedy"]),
        (["--temperature", "0", "--top-p", "0.9"], ["--top-p 0.9 would be ignored"]),
    ],
)
def test_generate_refuses_an_option_the_others_make_unused(extra, needles, tmp_path, capsys):
    """Refused before the run is read (the folder here holds no run at all)."""
    probe(capsys, ["generate", str(tmp_path), *extra], *needles)


def test_a_tiny_context_scores_a_bounded_number_of_validation_windows(tmp_path, monkeypatch):
    """A context of a few tokens makes a split of many windows: the reported loss scores
    FINAL_WINDOWS evenly spaced ones (here 50 of some 750), and says so, not every one."""
    from attnlab.data.text_lm import eval_starts, open_tokens
    from attnlab.runs import load_run, training
    from attnlab.tasks import lm

    monkeypatch.setattr(lm, "FINAL_WINDOWS", 50)
    text = tmp_path / "text.txt"
    text.write_text("anna sees bob.\n" * 1000, encoding="utf-8")  # 15,000 characters
    run = tmp_path / "lm"
    settings = {"data": str(text), "context": "2", "max_steps": "1", "d_model": "16",
                "n_layers": "1", "tensorboard": "false", "num_threads": "1"}  # fmt: skip
    results = training.train("lm", run, settings, "quick")
    loaded = load_run(run)
    val = open_tokens(run / "data" / "val.bin", loaded.tokenizer.vocab_size)
    every = eval_starts(len(val), 2, 0)
    assert len(every) > 50
    scope = f"50 evenly spaced of the validation split's {len(every):,} windows of 2 tokens"
    assert results["val_scope"].startswith(scope), results["val_scope"]
    want = lm.mean_loss(loaded.model, val, eval_starts(len(val), 2, 50), 32)
    assert results["val_loss"] == pytest.approx(want, rel=1e-6)
