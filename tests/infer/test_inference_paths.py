"""Predict's fast CPU paths: each within its tolerance of float32 (the tolerances are twice the
largest change benchmarks/infer/precision_sweep.py measured over ten seeds of these runs:
docs/results/precision_sweep.md), no label changed where float32 is surer than that, the int8
path the very model torch.ao's quantize_dynamic makes, and ``auto`` refusing a path that
changes a label on the check set."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.infer import precision as prec
from attnlab.infer.classifier import check_set
from attnlab.layers.attention import MultiHeadAttention

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "explore"))
import explore_runs  # noqa: E402

import _runs  # noqa: E402

# twice the sweep's largest |p - p_fp32| (int8 0.0095 on the e5 run, bf16 0.0018)
TOLERANCE = {"int8": 0.02, "bf16": 0.004}
TEXTS = check_set() + [
    "Great film, I loved it!",
    "好" * 300,
    "差",
    "电影前半段很无聊，但是结局让我感动",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("precision")
    return {  # seed 0 of the sweep: fixed weights, so no draw can leave the tolerance
        "e5 mean": _runs.e5_run(root / "e5", "mean", seed=0),
        "bert cls": _runs.bert_run(root / "bert", "cls", seed=0),
        "char": explore_runs.classifier_run(root / "char"),
    }


@pytest.mark.parametrize("path", [p for p in prec.available() if p != "fp32"])
@pytest.mark.parametrize("kind", ["e5 mean", "bert cls", "char"])
def test_each_path_is_within_its_tolerance_of_fp32(runs, kind, path) -> None:
    want = attnlab.load(runs[kind]).predict(TEXTS)
    got = attnlab.load(runs[kind], precision=path).predict(TEXTS)
    tol = TOLERANCE[path]
    for w, g in zip(want, got):
        assert {k: v for k, v in g.items() if k != "probs" and k != "label"} == {
            k: v for k, v in w.items() if k != "probs" and k != "label"
        }
        change = max(abs(g["probs"][c] - w["probs"][c]) for c in w["probs"])
        assert change <= tol, (w["text"][:20], change)
        if abs(max(w["probs"].values()) - 0.5) > tol:  # fp32 surer than the path's error
            assert g["label"] == w["label"], w["text"][:20]


def test_int8_is_torch_aos_dynamic_quantization_of_the_run(runs) -> None:
    clf = attnlab.load(runs["e5 mean"], precision="int8")
    oracle = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(clf.run.model), {torch.nn.Linear}, dtype=torch.qint8
    )
    got = torch.tensor([[p["probs"][c] for c in clf.labels] for p in clf.predict(TEXTS[:8])])
    assert torch.equal(got, clf.run.probs(oracle, TEXTS[:8]))
    assert not torch.equal(got, clf.run.probs(clf.run.model, TEXTS[:8]))  # a different path


def test_bf16_is_torch_autocast_of_the_run_with_its_weights_cast_once(runs) -> None:
    clf = attnlab.load(runs["e5 mean"])
    model = clf.run.model
    path = prec.convert(model, "bf16")
    assert isinstance(path, prec.Guarded)
    assert [type(m) for m in path.reference.modules()] == [type(m) for m in
                                                           prec.convert(model, "fp32").modules()]
    linears = [m for m in path.fast.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the run's untouched
    ours = {id(p) for m in model.modules() if isinstance(m, torch.nn.Linear)
            for p in m.parameters(recurse=False)}  # fmt: skip
    rest = [p for p in model.parameters() if id(p) not in ours]
    assert rest and {id(p) for p in rest} <= {id(p) for p in path.fast.parameters()}  # shared
    assert not ours & {id(p) for p in path.fast.parameters()}  # the cast ones are copies
    ids, lengths = clf.run.encode(TEXTS)
    oracle_model = copy.deepcopy(model)  # attention on the backend the path takes
    for module in oracle_model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = "matmul"
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        oracle = oracle_model(ids, lengths).float()
        plain = model(ids, lengths).float()  # the fused kernel: the same within bf16's rounding
    with torch.no_grad():
        assert torch.equal(path.fast(ids, lengths), oracle)
    assert (oracle.softmax(-1) - plain.softmax(-1)).abs().max() <= TOLERANCE["bf16"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_onednn_linear_is_nn_linear(seed) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    gen = torch.Generator().manual_seed(seed)
    print("seed", seed)
    for bias in (True, False):
        linear = torch.nn.Linear(48, 80, bias=bias)
        with torch.no_grad():
            for p in linear.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        x = torch.randn(6, 3, 48, generator=gen).transpose(0, 1)  # (3, 6, 48), not contiguous
        want = torch.nn.functional.linear(x.double(), linear.weight.double(),
                                          None if linear.bias is None else linear.bias.double())
        got = prec.OneDNNLinear(linear)(x)
        assert got.dtype == torch.float32 and got.shape == (3, 6, 80)
        assert ((got.double() - want).abs() / want.abs().max()).max() < 1e-6  # float32's rounding


def test_fp32_path_is_the_trained_model_with_its_linears_on_onednn(runs) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    clf = attnlab.load(runs["e5 mean"])
    model = clf.run.model
    path = clf.run.infer_model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    swapped = [m for m in path.modules() if isinstance(m, prec.OneDNNLinear)]
    assert linears and len(swapped) == len(linears)
    assert not any(isinstance(m, torch.nn.Linear) for m in path.modules())
    assert {id(p) for p in path.parameters()} == {id(p) for p in model.parameters()}  # shared
    assert all(isinstance(m, torch.nn.Linear) for m in linears)  # the run's own untouched
    ids, lengths = clf.run.encode(TEXTS)
    oracle = copy.deepcopy(model).double()
    with torch.no_grad():
        want = oracle(ids, lengths)
        error = (path(ids, lengths).double() - want).abs().max()
        plain = (model(ids, lengths).double() - want).abs().max()
    assert error <= 4 * plain + 1e-6, (error, plain)  # float32's rounding, as torch's own Linear


class Constant(torch.nn.Module):
    """A stand-in fast path: the same logits (C,) for every text."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, ids, lengths):
        return self.logits.expand(len(ids), -1).clone()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_close_calls_are_rerun_in_fp32_and_sure_ones_are_not(runs, seed) -> None:
    clf = attnlab.load(runs["e5 mean"])
    model = clf.run.model
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(TEXTS), generator=gen).tolist()
    texts = [TEXTS[i] for i in order][:12]
    ids, lengths = clf.run.encode(texts)
    with torch.no_grad():
        want = model(ids, lengths)  # (B, C)
        close = prec.Guarded(Constant([0.01, 0.0]), model, 0.06)  # every text a close call
        assert torch.allclose(close(ids, lengths), want, atol=1e-5), f"seed {seed}"
        assert (close.seen, close.rerun) == (len(texts), len(texts))
        sure = prec.Guarded(Constant([3.0, 0.0]), model, 0.06)  # p 0.95 / 0.05: none
        assert torch.equal(sure(ids, lengths), torch.tensor([[3.0, 0.0]] * len(texts)))
        assert sure.rerun == 0


def test_auto_refuses_a_path_that_changes_a_label(runs, monkeypatch) -> None:
    convert = prec.convert

    class Flipped(torch.nn.Module):  # the fastest "path", which swaps the classes
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, lengths):
            return self.model(ids, lengths).flip(-1)

    def flipping(model, precision):
        return Flipped(model) if precision == "int8" else convert(model, precision)

    monkeypatch.setattr(prec, "convert", flipping)
    clf = attnlab.load(runs["e5 mean"], precision="auto")
    path = clf.inference_path
    assert path.precision != "int8"
    int8 = next(t for t in path.trials if t.precision == "int8")
    assert int8.labels_changed > 0
    assert clf.predict(TEXTS[:4]) == attnlab.load(
        runs["e5 mean"], precision=path.precision
    ).predict(TEXTS[:4])


def test_auto_takes_a_path_whose_labels_equal_fp32s_and_says_why(runs, capsys) -> None:
    clf = attnlab.load(runs["bert cls"], precision="auto", threads="auto")
    path = clf.inference_path
    assert path.precision in prec.available() and path.threads == clf.threads
    assert all(t.labels_changed == 0 for t in path.trials if t.precision == path.precision)
    assert "labels equal to fp32's" in path.reason and path.precision in path.reason
    capsys.readouterr()
    assert main(["predict", str(runs["bert cls"]), "--precision", "auto", "好"]) == 0
    assert "predict: " in capsys.readouterr().err


def test_a_path_the_cpu_lacks_or_a_run_without_paths_is_one_line(runs, monkeypatch) -> None:
    monkeypatch.setattr(prec, "cpu_has_bf16", lambda: False)
    import attnlab.infer.classifier as classifier

    monkeypatch.setattr(classifier, "available", prec.available)
    with pytest.raises(UserError, match="no native bfloat16"):
        attnlab.load(runs["char"], precision="bf16")
    with pytest.raises(UserError, match="precision 'fp16'"):
        attnlab.load(runs["char"], precision="fp16")


def test_a_text_longer_than_training_read_is_marked(tmp_path, capsys) -> None:
    run = _runs.e5_run(tmp_path / "e5", max_len=64)
    report = run / "data_report.json"
    report.write_text('{"max_len": 16, "read_len": 64, "source": "tests"}', "utf-8")
    clf = attnlab.load(run)
    short, longer, cut = clf.predict(["好看", "好" * 30, "好" * 400])
    assert not short["longer_than_training"] and not short["truncated"]
    assert longer["longer_than_training"] and not longer["truncated"] and longer["tokens"] > 16
    assert cut["longer_than_training"] and cut["truncated"]
    capsys.readouterr()
    assert main(["predict", str(run), "好看", "好" * 30, "好" * 400]) == 0
    err = capsys.readouterr().err
    assert err.count("longer than the 16 pieces training read") == 1, err
