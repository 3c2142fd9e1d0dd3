"""Scoring a file: every input column kept (read back with the csv / json modules), the
predictions those of ``predict``; a resume after a kill at any byte scores each missing row
once and gives the file an uninterrupted run writes; bad input is one line, exit 2, no file."""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _runs  # noqa: E402

TEXTS = [
    "很好看",
    "剧情拖沓, 演技差",
    '多行\n文本 "引号"',
    "Great film!",
    "好" * 80,
    "差\u2028评",
    "一般般",
    "电影前半段很无聊，但是结局让我感动",
    "值得一看",
    "不推荐",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return _runs.e5_run(tmp_path_factory.mktemp("score") / "e5", max_len=32)


def write_input(path: Path) -> list[dict]:
    """The TEXTS with two other columns, written as ``path``'s extension says."""
    rows = [{"id": str(i), "review": t, "note": f"n{i},x"} for i, t in enumerate(TEXTS)]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(
                f, ["id", "review", "note"], delimiter="\t" if path.suffix == ".tsv" else ","
            )
            w.writeheader()
            w.writerows(rows)
    return rows


def read_output(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line]
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))


@pytest.mark.parametrize("src,dst", [(".csv", ".csv"), (".tsv", ".jsonl"), (".jsonl", ".tsv")])
def test_every_column_kept_and_the_predictions_added(run, tmp_path, src, dst) -> None:
    rows = write_input(tmp_path / f"in{src}")
    out = tmp_path / f"out{dst}"
    assert main(["predict", str(run), "--data", str(tmp_path / f"in{src}"), "--text-col",
                 "review", "--out", str(out), "--precision", "fp32"]) == 0  # fmt: skip
    want = attnlab.load(run).predict(TEXTS)
    got = read_output(out)
    assert len(got) == len(rows)
    for row, back, pred in zip(rows, got, want):
        assert {k: back[k] for k in row} == row
        assert back["predicted_label"] == pred["label"]
        for label, p in pred["probs"].items():
            assert float(back[f"prob_{label}"]) == pytest.approx(p, abs=1e-6)


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
def test_a_resume_after_a_kill_at_any_byte_scores_each_missing_row_once(
    run, tmp_path, ext, seed
) -> None:
    data = tmp_path / f"in{ext}"
    write_input(data)
    clf = attnlab.load(run)
    whole = tmp_path / f"whole{ext}"
    clf.score_file(data, whole, "review", progress=False)
    full = whole.read_bytes()
    scored: list[str] = []
    predict = clf.predict

    def counting(texts):
        scored.extend(texts)
        return predict(texts)

    clf.predict = counting  # type: ignore[method-assign]
    rng = random.Random(seed)
    cuts = sorted({0, len(full) - 1, *rng.sample(range(len(full)), 25)})
    for cut in cuts:
        part = tmp_path / f"part{cut}{ext}"
        part.write_bytes(full[:cut])
        scored.clear()
        done = clf.score_file(data, part, "review", resume=True, progress=False)
        assert part.read_bytes() == full, f"cut at byte {cut}"
        assert done["resumed"] + done["scored"] == len(TEXTS)
        assert scored == TEXTS[done["resumed"] :], f"cut at byte {cut}"


def test_a_resume_into_another_files_output_is_refused(run, tmp_path) -> None:
    data = tmp_path / "in.csv"
    write_input(data)
    out = tmp_path / "out.csv"
    attnlab.load(run).score_file(data, out, "review", progress=False)
    before = out.read_bytes()
    other = tmp_path / "other.csv"
    other.write_text("id,review,note\n0,别的,x\n", "utf-8")
    with pytest.raises(UserError, match="does not hold the rows of"):
        attnlab.load(run).score_file(other, out, "review", resume=True, progress=False)
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    "content,flag,where",
    [
        ("id,text\n1,好\n", ["--text-col", "review"], "in.csv:1: no column 'review'"),
        ("id,review\n1,好\n2,  \n", ["--text-col", "review"], "in.csv:3: empty text"),
        (b"id,review\n1,\xb2\xbb\xba\xc3\n", ["--text-col", "review"], "in.csv:2: byte 0xb2"),
        ("id,review\n1,好\n", ["--text-col", "review"], None),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    run, tmp_path, capsys, content, flag, where
) -> None:
    data = tmp_path / "in.csv"
    (data.write_bytes if isinstance(content, bytes) else data.write_text)(content)
    out = tmp_path / "out.csv"
    if where is None:  # OUT exists and no --resume: refused, OUT untouched
        out.write_text("mine\n", "utf-8")
        where = "out.csv exists; pass --resume"
    capsys.readouterr()
    assert main(["predict", str(run), "--data", str(data), "--out", str(out), *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert where in err and len(err.splitlines()) == 1, err
    assert "Fix:" in err or "--resume" in err
    assert not out.exists() or out.read_text("utf-8") == "mine\n"
