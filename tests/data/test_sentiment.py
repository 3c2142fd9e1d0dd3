"""The sentiment data rules: the out-of-domain sets, named corpora, extra training examples."""

from __future__ import annotations

from attnlab.data.sentiment import load_ood, ood_files, ood_texts


def test_ood_files_load_with_their_domain_and_phenomenon_columns(tmp_path):
    (tmp_path / "dev.tsv").write_text(
        "text\tlabel\tdomain\tphenomenon\n"
        "这部剧真好看\tpositive\tfilm\tplain\n"
        "菜并不差\tpositive\trestaurant\tnegation\n",
        encoding="utf-8",
    )
    assert ood_files(tmp_path) == {"dev": tmp_path / "dev.tsv"}
    corpus, tags = load_ood("dev", tmp_path)
    assert corpus.texts == ["这部剧真好看", "菜并不差"] and corpus.labels == ["positive"] * 2
    assert tags == [
        {"domain": "film", "phenomenon": "plain"},
        {"domain": "restaurant", "phenomenon": "negation"},
    ]
    assert ood_texts(tmp_path) == {"这部剧真好看", "菜并不差"}


def test_the_committed_ood_files_load_with_a_tag_per_row():
    for name in ood_files():
        corpus, tags = load_ood(name)
        assert len(tags) == len(corpus) >= 200 and all(tag["domain"] for tag in tags)
