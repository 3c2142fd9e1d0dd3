"""Tests for loading user CSV/TSV/JSONL files and their error messages."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from attnlab.data.errors import DataError
from attnlab.data.tabular import load_labeled_file


def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def _error(path: Path, **kwargs) -> DataError:
    with pytest.raises(DataError) as err:
        load_labeled_file(path, **kwargs)
    assert str(path) in str(err.value)
    assert "Fix:" in str(err.value)
    return err.value


def test_csv_with_quotes_multiline_field_blank_lines_and_bom(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "d.csv",
        '\ufeffid,text,label\n1,"好, 很好",pos\n\n2,"第一行\n第二行",neg\n3,  一般 , neutral \n',
    )
    corpus = load_labeled_file(path)
    assert corpus.texts == ["好, 很好", "第一行\n第二行", "一般"]
    assert corpus.labels == ["pos", "neg", "neutral"]
    assert corpus.origins == [f"{path}:2", f"{path}:4", f"{path}:6"]
    assert corpus.stats["per_label"] == {"neg": 1, "neutral": 1, "pos": 1}
    assert corpus.stats["format"] == "csv"


def test_tsv_and_custom_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.tsv", "y\tx\na\tone, two\nb\tthree\n")
    corpus = load_labeled_file(path, text_col="x", label_col="y")
    assert corpus.texts == ["one, two", "three"] and corpus.labels == ["a", "b"]


def test_jsonl_with_integer_labels_and_fmt_override(tmp_path: Path) -> None:
    rows = [{"text": "好", "label": 1}, {"text": "差", "label": "0", "extra": None}]
    path = _write(tmp_path / "d.txt", "\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    corpus = load_labeled_file(path, fmt="jsonl")
    assert corpus.labels == ["1", "0"] and corpus.texts == ["好", "差"]


def test_missing_column_lists_available_ones(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", "sentence,label\nx,a\n"))
    assert err.line == 1
    assert "'text'" in str(err) and "'sentence', 'label'" in str(err)


def test_semicolon_file_read_as_csv_hints_at_separator(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", "text;label\nx;a\n"))
    assert "comma-separated" in str(err)


@pytest.mark.parametrize("content", ["", "  \n\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    assert "empty" in str(_error(_write(tmp_path / "d.csv", content)))


def test_header_without_rows(tmp_path: Path) -> None:
    assert "no data rows" in str(_error(_write(tmp_path / "d.csv", "text,label\n\n")))


def test_non_utf8_bytes_give_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes("text,label\n好,a\n".encode() + "差".encode("gbk") + b",b\n")
    err = _error(path)
    assert err.line == 3 and "UTF-8" in str(err)


def test_empty_text_gives_the_line(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", "text,label\nok,a\n  ,b\n"))
    assert err.line == 3 and "empty text" in str(err)


def test_missing_label_gives_the_line(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", 'text,label\nok,a\n"two\nlines",\n'))
    assert err.line == 3 and "empty label" in str(err)


def test_wrong_field_count(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", "text,label\nok,a\nbad, text, b\n"))
    assert err.line == 3 and "expected 2" in str(err) and "found 3" in str(err)


def test_bad_json_line(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "b",\n'))
    assert err.line == 3 and "bad JSON" in str(err)


def test_json_line_not_an_object(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.jsonl", '["a", "x"]\n'))
    assert err.line == 1 and "list" in str(err)


def test_jsonl_missing_key_lists_keys(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n'))
    assert err.line == 2 and "'label'" in str(err) and "'text'" in str(err)


@pytest.mark.parametrize("label", ["null", "true", "1.5", '""'])
def test_jsonl_label_must_be_a_nonempty_string_or_int(tmp_path: Path, label: str) -> None:
    err = _error(_write(tmp_path / "d.jsonl", f'{{"text": "a", "label": {label}}}\n'))
    assert err.line == 1


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    error = str(_error(_write(tmp_path / "d.txt", "text,label\na,b\n")))
    assert ".csv, .tsv (.tab) or .jsonl" in error and "fmt=" not in error  # no such option
    assert "no such file" in str(_error(tmp_path / "absent.csv"))
    with pytest.raises(ValueError, match="unknown format"):
        load_labeled_file(tmp_path / "d.txt", fmt="xlsx")


def test_crlf_line_endings_keep_line_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.csv", 'text,label\r\n"a\r\nb",x\r\n\r\n ,y\r\n')
    assert _error(path).line == 5
    path = _write(tmp_path / "d.jsonl", '{"text": "a", "label": "x"}\r\n{"text": "b", "label": 2}')
    assert load_labeled_file(path).labels == ["x", "2"]


@pytest.fixture
def default_csv_limit():
    """The csv module's default field limit, restored afterwards (the limit is per process)."""
    before = csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(before)


@pytest.mark.parametrize("quoted", [False, True])
@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_a_field_over_the_csv_module_default_limit_loads(
    tmp_path: Path, fmt: str, quoted: bool, default_csv_limit: None
) -> None:
    long = "长" * 200_000  # csv.field_size_limit() defaults to 131,072 characters
    sep = "," if fmt == "csv" else "\t"
    field = f'"{long}"' if quoted else long
    path = _write(tmp_path / f"d.{fmt}", f"text{sep}label\n{field}{sep}pos\nshort{sep}neg\n")
    corpus = load_labeled_file(path)
    assert corpus.texts == [long, "short"] and corpus.labels == ["pos", "neg"]


def test_a_quote_never_closed_names_the_line_it_opens_on(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.csv", 'text,label\nfine,pos\n"broken,neg\nmore,pos\nlast,neg\n')
    err = _error(path)
    assert err.line == 3 and "never closed" in str(err) and "unbalanced quote" in str(err)
    assert "\n" not in str(err)


def test_a_stray_quote_after_a_quoted_field_is_an_error_not_a_guess(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", 'text,label\nok,pos\n"She said "hi" today",neg\n'))
    assert err.line == 3 and "followed by more text instead of a comma" in str(err)
    assert '""' in err.fix  # how to write a quote inside a quoted field
    # an unbalanced quote that swallows lines until a later quote: named with both lines
    text = 'text,label\n"broken,neg\nmore,pos\nthird "q",neg\n'
    err = _error(_write(tmp_path / "e.csv", text))
    assert err.line == 4 and "opened on line 2" in str(err)


def test_a_swallowed_row_with_the_wrong_field_count_points_at_the_quote(tmp_path: Path) -> None:
    err = _error(_write(tmp_path / "d.csv", 'text,label\n"a,b\nc",x,y\n'))
    assert err.line == 2 and "from line 2 to line 3" in str(err)
    assert "unbalanced quote" in err.fix


def test_text_and_label_in_one_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label\na,pos\n", encoding="utf-8")
    with pytest.raises(DataError, match="same column"):
        load_labeled_file(path, text_col="label", label_col="label")


def test_text_of_zero_width_characters_only_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label\n好,pos\n\u200b\u200c\u200d,neg\n", encoding="utf-8")
    with pytest.raises(DataError, match="empty text") as err:
        load_labeled_file(path)
    assert err.value.line == 3
