"""`attnlab export`: every way a user loads the export gives `attnlab predict`'s numbers or
fails loudly.

The oracles are transformers (the standard snippet: AutoTokenizer +
AutoModelForSequenceClassification, and pipeline) and onnxruntime, fed texts short and long
(past the run's max_len, past XLM-R's 512 positions) and texts holding the literal strings of
the special tokens. The [CLS] head is checked against XLMRobertaForSequenceClassification and
BertForSequenceClassification in float64. Then the misuse: a quantised run, a pruned run, an
--out that cannot be written or is claimed by another export, Ctrl-C inside torch's exporter.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attnlab.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
import _runs  # noqa: E402

transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"
TEXTS = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓",
    "Great film, I loved it!",
    "好看的电影，" * 40,  # past max_len
    "一部电影，" * 400,  # past XLM-R's 512 positions
    "一般 <s> 好 </s> 看 <unk> 差",
]
PAD_TEXT = "好 <pad> 看"  # a literal <pad>: the pad id inside a text
FP16_WORDS = 1e-4  # probabilities: the run's 4-bit word table rounded to float16
EXACT = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    return {
        "e5 mean": _runs.e5_run(root / "e5mean", "mean", max_len=48),
        "e5 cls": _runs.e5_run(root / "e5cls", "cls", max_len=48),
        "bert mean": _runs.bert_run(root / "bertmean", "mean"),
        "bert cls": _runs.bert_run(root / "bertcls", "cls"),
    }


def predicted(capsys, run: Path, texts: list[str]) -> list[float]:
    """P(positive) of each text, as `attnlab predict --json` prints it."""
    capsys.readouterr()
    assert main(["predict", str(run), "--json", *texts]) == 0
    return [json.loads(line)["probs"]["positive"] for line in capsys.readouterr().out.splitlines()]


def export(run: Path, fmt: str, out: Path, *extra: str) -> int:
    return main(["export", str(run), "--format", fmt, "--out", str(out), *extra])


def native(folder: Path, texts: list[str]) -> list[float]:
    """P(positive) of each text through the model card's snippet: AutoTokenizer and
    AutoModelForSequenceClassification on the folder, no remote code, padded together."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    batch = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.softmax(model(**batch).logits, -1)[:, 1].tolist()


@pytest.mark.parametrize("kind", ["e5 mean", "e5 cls", "bert mean", "bert cls"])
def test_the_snippet_and_pipeline_give_predict_s_numbers(runs, kind, tmp_path, capsys) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    run, out = runs[kind], tmp_path / "hf"
    assert export(run, "hf", out) == 0
    mean = kind.endswith("mean")
    ours = predicted(capsys, run, TEXTS)
    model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=mean)
    tokenizer = AutoTokenizer.from_pretrained(out)
    pipe = pipeline("text-classification", model=str(out), trust_remote_code=mean, top_k=None)
    tol = FP16_WORDS if kind.startswith("e5") else EXACT
    for text, p in zip(TEXTS, ours):
        long = len(tokenizer(text)["input_ids"]) > 48
        if mean or not long:  # the mean class cuts a long input itself
            with torch.no_grad():
                logits = model(**tokenizer(text, return_tensors="pt")).logits
            assert abs(torch.softmax(logits, -1)[0, 1].item() - p) < tol, text
            scores = {d["label"]: d["score"] for d in pipe([text])[0]}
            assert abs(scores["positive"] - p) < tol, text
        else:  # the native class reads no further than the run: it says so, loudly
            with pytest.raises((IndexError, RuntimeError)):
                model(**tokenizer(text, return_tensors="pt"))
        enc = tokenizer(text, truncation=True, return_tensors="pt")  # cut as predict cuts
        with torch.no_grad():
            logits = model(**enc).logits
        assert abs(torch.softmax(logits, -1)[0, 1].item() - p) < tol, text
        scores = {d["label"]: d["score"] for d in pipe([text], truncation=True)[0]}
        assert abs(scores["positive"] - p) < tol, text
    batch = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**batch).logits, -1)[:, 1]
    assert max(abs(a - b) for a, b in zip(probs.tolist(), ours)) < tol  # padded together


def test_a_literal_pad_in_the_text_reads_as_predict_reads_it(runs, tmp_path, capsys) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run, out = runs["e5 mean"], tmp_path / "hf"
    assert export(run, "hf", out) == 0
    (p,) = predicted(capsys, run, [PAD_TEXT])
    model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True)
    enc = AutoTokenizer.from_pretrained(out)(PAD_TEXT, return_tensors="pt")
    assert 1 in enc["input_ids"][0, 1:-1].tolist()  # the pad id, inside the text
    with torch.no_grad():
        logits = model(**enc).logits
    assert abs(torch.softmax(logits, -1)[0, 1].item() - p) < FP16_WORDS


def test_a_literal_pad_reads_the_same_in_the_native_class(runs, tmp_path, capsys) -> None:
    run, out = runs["e5 cls"], tmp_path / "hf"
    assert export(run, "hf", out, "--words", "float32") == 0
    (p,) = predicted(capsys, run, [PAD_TEXT])
    (got,) = native(out, [PAD_TEXT])
    assert abs(got - p) < EXACT


@pytest.mark.parametrize("kind", ["e5 mean", "bert cls"])
def test_onnxruntime_gives_predict_s_numbers_for_any_length(runs, kind, tmp_path, capsys) -> None:
    ort = pytest.importorskip("onnxruntime")
    from tokenizers import Tokenizer

    run, out = runs[kind], tmp_path / "model.onnx"
    assert export(run, "onnx", out) == 0
    session = ort.InferenceSession(str(out))
    tok = Tokenizer.from_file(str(run / "tokenizer.json"))  # no truncation: the graph cuts
    texts = [*TEXTS, PAD_TEXT]
    ours = predicted(capsys, run, texts)
    for batch in (texts, texts[:2], texts[3:5]):  # batch sizes, lengths below and above
        encs = tok.encode_batch(batch)
        width = max(len(e.ids) for e in encs)
        pad = tok.token_to_id("<pad>") if kind.startswith("e5") else tok.token_to_id("[PAD]")
        ids = [e.ids + [pad] * (width - len(e.ids)) for e in encs]
        mask = [[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encs]
        (logits,) = session.run(None, {"input_ids": torch.tensor(ids).numpy(),
                                       "attention_mask": torch.tensor(mask).numpy()})  # fmt: skip
        probs = torch.softmax(torch.from_numpy(logits), -1)[:, 1].tolist()
        for text, got in zip(batch, probs):
            assert abs(got - ours[texts.index(text)]) < EXACT, text


@pytest.mark.parametrize("xlmr", [True, False])
def test_cls_pooling_is_the_native_head_exactly_in_float64(xlmr, seed) -> None:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from attnlab.commands.export_hf import hf_config, hf_tensors
    from attnlab.models.bert import BertClassifier, BertConfig

    offset = 2 if xlmr else 0
    cfg = BertConfig(vocab_size=90, d_model=16, n_layers=2, n_heads=2, d_ff=32, context=40,
                     pad_id=1 if xlmr else 0, position_offset=offset, dropout=0.0,
                     attn_dropout=0.0)  # fmt: skip
    ours = BertClassifier(cfg, 3, "cls").double().eval()
    for p in ours.parameters():  # every tensor drawn, the pooler and head included
        torch.nn.init.normal_(p, std=0.3)
    config = AutoConfig.for_model(**hf_config(cfg, ["a", "b", "c"], "cls", 40, 2))
    theirs = AutoModelForSequenceClassification.from_config(config).double().eval()
    missing, unexpected = theirs.load_state_dict(hf_tensors(ours, "cls", 40, torch.float64),
                                                 strict=False)  # fmt: skip
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    lengths = torch.tensor([9, 4, 1])
    ids = torch.randint(3, 90, (3, 9))
    mask = torch.arange(9)[None] < lengths[:, None]
    ids = ids.masked_fill(~mask, cfg.pad_id)
    with torch.no_grad():
        a = ours(ids, lengths)
        b = theirs(input_ids=ids, attention_mask=mask.long()).logits
    assert type(theirs).__name__ == ("XLMRoberta" if xlmr else "Bert") + "ForSequenceClassification"
    assert (a - b).abs().max() < 1e-12


def test_a_mean_pooled_folder_refuses_the_snippet_without_remote_code(runs, tmp_path) -> None:
    from transformers import AutoModelForSequenceClassification, pipeline

    out = tmp_path / "hf"
    assert export(runs["e5 mean"], "hf", out) == 0
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForSequenceClassification.from_pretrained(out)
    with pytest.raises(ValueError, match="trust_remote_code"):
        pipeline("text-classification", model=str(out))


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_take_the_mode_the_umask_gives(runs, tmp_path, umask) -> None:
    """Every exported file gets the mode any new file gets (safetensors alone would make its
    file 0600, unreadable by a server run as another user; a forced 0644 would override a
    private umask)."""
    folder, graph = tmp_path / "hf", tmp_path / "model.onnx"
    before = os.umask(umask)
    try:
        assert export(runs["e5 cls"], "hf", folder) == 0
        assert export(runs["e5 cls"], "onnx", graph) == 0
    finally:
        os.umask(before)
    for file in [*folder.iterdir(), graph]:
        assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file


def test_the_word_table_is_half_size(runs, tmp_path) -> None:
    from safetensors import safe_open

    small, exact = tmp_path / "small", tmp_path / "exact"
    assert export(runs["e5 cls"], "hf", small) == 0
    assert export(runs["e5 cls"], "hf", exact, "--words", "float32") == 0
    name = "roberta.embeddings.word_embeddings.weight"
    with safe_open(small / "model.safetensors", "pt") as f:
        assert f.get_slice(name).get_dtype() == "F16"
        assert f.get_slice("classifier.dense.weight").get_dtype() == "F32"
    config = json.loads((small / "config.json").read_text())
    assert config["dtype"] == "float32" and config["max_position_embeddings"] == 48 + 2
    sizes = [(d / "model.safetensors").stat().st_size for d in (small, exact)]
    words = 250037 * 32
    assert abs(sizes[1] - sizes[0] - words * 2) < 1024  # 2 bytes a weight fewer (and header)
    with pytest.raises(SystemExit):  # argparse: not a choice
        export(runs["e5 cls"], "hf", tmp_path / "x", "--words", "int4")


# ---------------------------------------------------------------------------- misuse


def refused(capsys, run: Path, fmt: str, out: Path, *needles: str) -> str:
    """Export, expecting exit 2 and one line on stderr naming each needle."""
    capsys.readouterr()
    assert export(run, fmt, out) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("attnlab: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_a_quantised_run_exports_its_function_or_is_refused(runs, tmp_path, capsys) -> None:
    run = runs["bert cls"]
    weights, dynamic = tmp_path / "int8", tmp_path / "int8-dynamic"
    assert main(["quantize", str(run), "--out", str(weights)]) == 0
    assert main(["quantize", str(run), "--out", str(dynamic), "--activations", "dynamic"]) == 0
    assert export(weights, "hf", tmp_path / "hf") == 0
    assert "int8 linear layers written as float32" in capsys.readouterr().out
    ours = predicted(capsys, weights, TEXTS[:3])
    got = native(tmp_path / "hf", TEXTS[:3])
    assert max(abs(a - b) for a, b in zip(got, ours)) < EXACT
    assert export(weights, "onnx", tmp_path / "m.onnx") == 0
    for fmt, out in (("hf", tmp_path / "hf2"), ("onnx", tmp_path / "m2.onnx")):
        refused(capsys, dynamic, fmt, out, "activations", "export the run it was made from")
        assert not out.exists()


def test_a_run_of_another_kind_is_one_line_and_leaves_nothing(tmp_path, capsys) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
    import explore_runs

    char = explore_runs.classifier_run(tmp_path / "runs")
    refused(capsys, char, "hf", tmp_path / "hf", "fine-tuned from a BERT or XLM-R encoder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_pruned_run_exports_to_a_folder_transformers_loads(tmp_path, capsys) -> None:
    run = _runs.e5_run(tmp_path / "pruned", "cls", max_len=48, prune=[[1], [0, 2]], n_heads=4)
    assert export(run, "hf", tmp_path / "hf", "--words", "float32") == 0
    ours = predicted(capsys, run, TEXTS[:3])
    got = native(tmp_path / "hf", TEXTS[:3])
    assert max(abs(a - b) for a, b in zip(got, ours)) < EXACT


def test_an_out_that_cannot_be_written_is_one_line_before_any_work(
    runs, tmp_path, capsys, monkeypatch
) -> None:
    import attnlab.runs.load

    def never(*args, **kwargs):
        raise AssertionError("the run was loaded before --out was known to be writable")

    monkeypatch.setattr(attnlab.runs.load, "load_run", never)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for fmt in ("hf", "onnx"):
        refused(capsys, runs["e5 mean"], fmt, a_file / "out", "is a file, not a folder")
        refused(capsys, runs["e5 mean"], fmt, a_file, "exists")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    real_mkdir, real_open = Path.mkdir, Path.open

    def read_only(path: Path) -> None:  # what a read-only mount answers (root ignores modes)
        if readonly in path.parents:
            raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(Path, "mkdir", lambda p, *a, **k: read_only(p) or real_mkdir(p, *a, **k))
    monkeypatch.setattr(Path, "open", lambda p, *a, **k: read_only(p) or real_open(p, *a, **k))
    for fmt, name in (("hf", "hf"), ("onnx", "m.onnx")):
        out = readonly / name
        refused(capsys, runs["e5 mean"], fmt, out, "cannot write --out", "Read-only file system")
    assert list(readonly.iterdir()) == []


def test_two_exports_to_one_out_at_once_the_second_is_refused(runs, tmp_path, capsys,
                                                              monkeypatch) -> None:  # fmt: skip
    import attnlab.commands.export_onnx as export_onnx

    real, started, release = export_onnx.write_onnx, threading.Event(), threading.Event()

    def slow(*args, **kwargs):  # the first export holds here, mid-work
        started.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(export_onnx, "write_onnx", slow)
    out = tmp_path / "m.onnx"
    codes = []
    first = threading.Thread(target=lambda: codes.append(export(runs["bert cls"], "onnx", out)))
    first.start()
    assert started.wait(120)
    monkeypatch.setattr(export_onnx, "write_onnx", real)
    refused(capsys, runs["e5 mean"], "onnx", out, "exists")  # while the first is still writing
    release.set()
    first.join(300)
    assert codes == [0]
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(out))  # the first's graph: BERT's vocabulary
    ids = torch.tensor([[101, 2307, 102]]).numpy()
    assert session.run(None, {"input_ids": ids, "attention_mask": ids * 0 + 1})[0].shape == (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_ctrl_c_inside_torch_s_exporter_stops_the_export(runs, tmp_path, monkeypatch) -> None:
    real, calls = torch.export.export, []

    def interrupted(*args, **kwargs):  # Ctrl-C, which torch's internals turn into an error
        calls.append(1)
        if len(calls) == 1:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                raise RuntimeError("graph capture failed") from None
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", interrupted)
    out = tmp_path / "m.onnx"
    assert export(runs["bert cls"], "onnx", out) == 130
    assert list(tmp_path.iterdir()) == []


def test_a_missing_exporter_names_what_to_install(runs, tmp_path, capsys, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_onnxscript(name, *args, **kwargs):
        if name == "onnxscript":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxscript)
    needles = ("needs onnxscript", "pip install onnx==1.23.2 onnxscript==0.7.2")
    refused(capsys, runs["e5 mean"], "onnx", tmp_path / "m.onnx", *needles)
    assert not (tmp_path / "m.onnx").exists()
