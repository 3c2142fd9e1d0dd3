"""Translation task: pair files, split, tokenizers, batches, bundled corpus, CLI end to end."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data.errors import DataError
from attnlab.data.parallel import (
    Pair,
    ParallelData,
    TextTokenizer,
    read_pairs,
    split_pairs,
    synthetic_pairs,
)
from attnlab.tasks.translate import TranslateDataConfig, build_config, load_pairs


def test_tsv_and_jsonl_pairs_with_line_numbers(tmp_path: Path) -> None:
    good = tmp_path / "pairs.tsv.gz"
    with gzip.open(good, "wt", encoding="utf-8") as f:
        f.write("a b\tx y\tg1\n\nc\tz\n")
    assert read_pairs(good) == [Pair("a b", "x y", "g1"), Pair("c", "z", "line 3")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nonly one column\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: 1 tab-separated columns"):
        read_pairs(bad)
    empty = tmp_path / "empty.tsv"
    empty.write_text("a\tb\n \tb\n")
    with pytest.raises(DataError, match=r"empty.tsv:2: an empty source"):
        read_pairs(empty)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"src": "a", "tgt": "b"}\n{"src": "a"}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: no string field 'tgt'"):
        read_pairs(jsonl)
    jsonl.write_text('{"src": "a", "tgt": "b", "group": "G"}\n{oops\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: invalid JSON"):
        read_pairs(jsonl)


def test_split_is_deterministic_and_keeps_groups_together() -> None:
    pairs = [Pair(f"s{i}", f"t{i}", f"book {i % 50}") for i in range(1000)]
    a = split_pairs(pairs, 10.0, 10.0)
    b = split_pairs(pairs[::-1], 10.0, 10.0)
    assert all(set(a[k]) == set(b[k]) for k in a)  # membership depends on the group only
    groups = {k: {p.group for p in v} for k, v in a.items()}
    assert not groups["train"] & groups["test"] and not groups["dev"] & groups["test"]
    assert sum(len(v) for v in a.values()) == 1000
    with pytest.raises(ValueError, match="split is empty"):
        split_pairs(pairs[:3], 1.0, 1.0)


@pytest.mark.parametrize("kind", ["bpe", "unigram", "char"])
def test_tokenizers_round_trip_with_fixed_special_ids(kind: str, tmp_path: Path) -> None:
    texts = ["the cat sat on the mat", "a dog and a cat", "der Hund und die Katze"] * 20
    tok = TextTokenizer.train(texts, kind, 80)
    for i, special in enumerate(["<pad>", "<s>", "</s>", "<unk>"]):
        assert tok.tok.token_to_id(special) == i
    ids = tok.encode("the dog and the cat")
    assert min(ids) > 3 and tok.decode(ids) == "the dog and the cat"
    tok.save(tmp_path / "t.json")
    assert TextTokenizer.load(tmp_path / "t.json").encode("a cat") == tok.encode("a cat")
    zh = TextTokenizer.train(["起初，神创造天地。"], "char", 50)
    assert len(zh.encode("神创造")) == 3 and zh.decode(zh.encode("神创造")) == "神创造"


def test_batches_shift_targets_and_respect_the_budget() -> None:
    src = [[5] * n for n in (3, 8, 2, 6, 7)]
    tgt = [[6 + i] * n for i, n in enumerate((4, 2, 9, 5, 3))]
    data = ParallelData(src, tgt, max_tokens=24, seed=1)
    seen = []
    for batch in data.batches(0):
        b = data.collate(batch)
        rows = len(batch)
        assert rows * max(b["src"].shape[1], b["tgt_in"].shape[1]) <= 24
        assert (b["tgt_in"][:, 0] == 1).all()
        for r, i in enumerate(batch):
            n = len(tgt[i])
            assert b["tgt_out"][r, :n].tolist() == tgt[i] and b["tgt_out"][r, n] == 2
            assert b["tgt_in"][r, 1 : n + 1].tolist() == tgt[i]
            assert (b["tgt_out"][r, n + 1 :] == 0).all()
        assert data.num_tokens(b) == sum(len(tgt[i]) + 1 for i in batch)
        seen += batch
    assert sorted(seen) == list(range(5))
    assert data.batches(3) == ParallelData(src, tgt, 24, seed=1).batches(3)


def test_synthetic_and_bundled_corpus() -> None:
    rev = synthetic_pairs("reverse", 5, seed=3)
    assert all(p.tgt == p.src[::-1] for p in rev) and rev == synthetic_pairs("reverse", 5, 3)
    pairs = load_pairs(TranslateDataConfig(pair="en-zh"), seed=0)
    assert len(pairs) > 31_000
    john = next(p for p in pairs if p.src.startswith("For God so loved the world"))
    assert john.group == "John 3" and "神爱世人" in john.tgt  # simplified script
    de = load_pairs(TranslateDataConfig(pair="de-en"), seed=0)
    assert de[0] == Pair("Im Anfang schuf Gott die Himmel und die Erde.", pairs[0].src, "Gen 1")
    splits = split_pairs(de)
    chapters = {k: {p.group for p in v} for k, v in splits.items()}
    assert not chapters["train"] & (chapters["dev"] | chapters["test"])
    assert 0.01 < len(splits["test"]) / len(de) < 0.04


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="pair must be"):
        build_config(None, {"pair": "en-fr"})
    with pytest.raises(ValueError, match="unknown setting 'n_layer'"):
        build_config(None, {"n_layer": "2"})
    cfg = build_config("copy", {"lr": "0.002"})
    assert cfg.data.synthetic == "copy" and cfg.train.lr == 0.002


def test_default_preset_fits_a_cpu_budget_and_base_is_the_bigger_model() -> None:
    """The default trains for 20 minutes with the schedule on the clock; `base` lifts both."""
    cfg = build_config(None, {})
    assert (cfg.model.d_model, cfg.model.n_encoder_layers, cfg.data.vocab_size) == (128, 2, 4000)
    assert cfg.train.max_minutes == 20.0 and cfg.train.schedule_by_time
    base = build_config("base", {})
    assert (base.model.d_model, base.model.n_encoder_layers, base.data.vocab_size) == (256, 3, 8000)
    assert base.train.max_minutes == 0.0 and not base.train.schedule_by_time
    enzh = build_config("enzh", {})  # the settings of the committed en->zh character run
    overrides = {
        "tgt_tokenizer": "char",
        "shared_embeddings": "false",
        "max_sentence_tokens": "128",
    }
    assert enzh == build_config(None, {"pair": "en-zh", **overrides})
    copy = build_config("copy", {})  # the CI task stays step-bound, so it is deterministic
    assert copy.train.max_minutes == 0.0 and not copy.train.schedule_by_time


def test_copy_task_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled copy preset trains to >= 99% exact match; translate and eval use the run."""
    run = tmp_path / "copy"
    assert main(["train", "translate", "--config", "copy", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["test"]["exact_match"] >= 0.99, results["test"]
    assert results["test"]["chrf"] >= 99.0
    capsys.readouterr()
    assert main(["translate", str(run), "hgfedcba", "abcabc"]) == 0
    assert capsys.readouterr().out.split() == ["hgfedcba", "abcabc"]
    assert main(["eval", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exact_match"] >= 0.99 and report["n"] == results["test"]["n"]
    hyps = (run / "test.hyp.txt").read_text().splitlines()
    assert len(hyps) == report["n"]
    (tmp_path / "in.txt").write_text("abc\n\ndcba\n")
    out = tmp_path / "out.txt"
    args = ["translate", str(run), "--input", str(tmp_path / "in.txt"), "--output", str(out)]
    assert main(args) == 0
    assert out.read_text().splitlines() == ["abc", "", "dcba"]
    # one-token lines have no 4-grams: BLEU is reported as undefined, not as 0.00
    assert report["bleu"] is None and "4-grams" in report["bleu_note"]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "BLEU n/a" in capsys.readouterr().out
    # input outside the source vocabulary is translated with a warning
    assert main(["translate", str(run), "abc", "xyz!"]) == 0
    err = capsys.readouterr().err
    assert "input 2 has" in err and "outside the model's source vocabulary" in err
    assert "input 1" not in err


def test_separate_vocabularies_take_their_own_sizes(tmp_path: Path) -> None:
    """tgt_tokenizer_size sizes the target tokenizer alone; a shared vocabulary refuses it."""
    from attnlab.tasks.translate import prepare

    cfg = build_config("copy", {"shared_embeddings": "false", "vocab_size": "12"})
    cfg.data.tgt_tokenizer_size = 20
    prep = prepare(cfg, tmp_path / "a", resume=False)
    assert (prep.src_tok.vocab_size, prep.tgt_tok.vocab_size) == (12, 20)
    shared = build_config("copy", {"tgt_tokenizer_size": "20"})
    with pytest.raises(ValueError, match="a shared vocabulary has one size"):
        prepare(shared, tmp_path / "b", resume=False)
    with pytest.raises(ValueError, match="tgt_tokenizer_size must be >= 0"):
        build_config(None, {"tgt_tokenizer_size": "-1"})
