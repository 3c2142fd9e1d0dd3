"""Predict through ``torch.compile`` (``compile=True``, ``--compile``): the same numbers as the
eager path it compiles, its Linear weights frozen and packed for oneDNN, compiled once at load
(no recompile for a lone text or a new length), and a clear line where it cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.infer import classifier
from attnlab.infer import precision as prec
from attnlab.serve.app import App

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "explore"))
import explore_runs  # noqa: E402

import _runs  # noqa: E402

TEXTS = ["好看", "剧情拖沓，演员也不行", "电影前半段很无聊，但是结局让我感动", "好" * 40, "Great!"]

pytestmark = pytest.mark.skipif(prec.compile_missing() is not None, reason="no C++ compiler")


def probs(predictions: list[dict]) -> torch.Tensor:
    return torch.tensor([list(p["probs"].values()) for p in predictions], dtype=torch.float64)


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_fp32_is_the_eager_model_and_compiles_once(tmp_path) -> None:
    run = explore_runs.classifier_run(tmp_path / "char")
    want = attnlab.load(run).predict(TEXTS)
    before = graphs()
    clf = attnlab.load(run, compile=True)
    assert isinstance(clf.run.infer_model, prec.Compiled)
    assert "compiled with torch.compile" in clf.inference_path.reason
    compiled = graphs()
    assert compiled > before  # the graph was built at load, on the check set
    got = clf.predict(TEXTS)
    alone = clf.predict(TEXTS[2:3])  # a batch of one runs as two rows of the same text
    longer = clf.predict(["好" * 90, "差" * 70])  # lengths the check set never had
    assert graphs() == compiled  # none of these compiled again
    assert torch.allclose(probs(got), probs(want), atol=1e-5)
    assert torch.allclose(probs(alone), probs(want[2:3]), atol=1e-5)
    assert [p["label"] for p in got] == [p["label"] for p in want]
    assert probs(longer).shape == (2, len(clf.labels))
    app = App(clf, max_texts=8)  # the server answers from its batching thread
    assert app.limits()["path"] == "fp32 compiled"
    assert app.predict({"texts": TEXTS[:3]})["predictions"] == clf.predict(TEXTS[:3])
    assert graphs() == compiled


def test_compiled_bf16_keeps_the_float32_rerun_and_stays_near_fp32(tmp_path) -> None:
    run = _runs.e5_run(tmp_path / "e5", "mean", seed=0)
    if "bf16" not in prec.available():
        pytest.skip("no native bfloat16 on this CPU")
    want = attnlab.load(run).predict(TEXTS)
    eager = attnlab.load(run, precision="bf16").predict(TEXTS)
    packed = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    clf = attnlab.load(run, precision="bf16", compile=True)
    path = clf.run.infer_model
    assert isinstance(path, prec.Guarded) and isinstance(path.fast, prec.Compiled)
    assert not isinstance(path.reference, prec.Compiled)  # close calls decided eagerly in fp32
    assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] > packed  # frozen
    compiled = graphs()
    got = clf.predict(TEXTS)
    ids, _ = clf.run.encode(TEXTS[:2])
    for width in (3, 31, 32, 33, 48, clf.run.max_len):  # each side of the eager softmax's cases
        with torch.no_grad():
            path(ids[:, :1].repeat(1, width), torch.full((2,), width))
    assert graphs() == compiled  # one graph, built at load, for every width predict reads
    # the compiled pass fuses casts and LayerNorm that eager bf16 rounds between kernels: its
    # probabilities stay within the bf16 path's own tolerance of both (test_inference_paths)
    assert (probs(got) - probs(eager)).abs().max() <= 0.004
    assert (probs(got) - probs(want)).abs().max() <= 0.004


def test_where_compile_cannot_run_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    run = explore_runs.classifier_run(tmp_path / "char")
    with pytest.raises(UserError, match="not int8's"):
        attnlab.load(run, precision="int8", compile=True)
    monkeypatch.setattr(classifier, "compile_missing", lambda: "torch.compile needs a C++ compiler")
    with pytest.raises(UserError, match="C\\+\\+ compiler.*drop --compile"):
        attnlab.load(run, compile=True)
    assert main(["predict", str(run), "--compile", "好看"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "C++ compiler" in err[0], err
