"""Tests for UTF-8 reading and atomic writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.data import io as data_io
from attnlab.data.errors import DataError
from attnlab.data.io import atomic_write_text, read_json, read_utf8


def test_read_utf8_drops_bom_and_locates_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"\xef\xbb\xbfab\n")
    assert read_utf8(path) == "ab\n"
    path.write_bytes(b"ok\nstill ok\nab\xff\n")
    with pytest.raises(DataError) as err:
        read_utf8(path)
    assert err.value.line == 3 and "0xff" in str(err.value) and "column 3" in str(err.value)
    with pytest.raises(DataError, match="is a directory"):
        read_utf8(tmp_path)


def test_read_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{\n"a": 1,\n}', encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_json(path, "thing")
    assert err.value.line == 3 and "thing" in str(err.value)


@pytest.mark.parametrize(
    "content,problem",
    [
        (None, "no such run config file"),
        ("", "the run config file is empty"),
        ('{"task": "classify",', "not a valid run config JSON file"),
        (b"\xff{}", "not valid UTF-8"),
    ],
)
def test_read_json_is_one_line_naming_file_kind_and_fix(
    tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    path = tmp_path / "run" / "config.json"
    if content is not None:
        path.parent.mkdir()
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as err:
        read_json(path, "run config", fix="retrain into a new --out")
    message = str(err.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message
    if "UTF-8" not in problem:
        assert message.endswith("Fix: retrain into a new --out")


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.json"
    atomic_write_text(path, "old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(data_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize(
    "raw, needles",
    [
        ("评论,好".encode("utf-16"), ["UTF-16", "iconv -f UTF-16"]),
        (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", ["not a text file", "NUL bytes"]),
        ("这部电影很好".encode("gb18030"), ["GB18030"]),
    ],
)
def test_the_encoding_hint_fits_the_file(tmp_path: Path, raw: bytes, needles: list[str]) -> None:
    path = tmp_path / "f.csv"
    path.write_bytes(raw)
    with pytest.raises(DataError) as err:
        read_utf8(path)
    for needle in needles:
        assert needle in str(err.value)
    if "GB18030" not in needles:
        assert "GB18030" not in str(err.value)


def test_blank_and_line_splitting() -> None:
    assert data_io.is_blank(" \u200b\u200d\ufeff\t") and not data_io.is_blank("\u200ba")
    assert data_io.split_lines("a\rb\r\nc\n\nd") == ["a", "b", "c", "", "d"]
    assert data_io.split_lines("one\n") == ["one"] and data_io.split_lines("") == []


def test_output_errors_are_one_line(tmp_path: Path) -> None:
    from attnlab.errors import UserError

    refused = pytest.raises(UserError, match=r"cannot write .* \(Is a directory\); pass --out")
    with refused, data_io.output_errors("--out"):
        (tmp_path).open("w")
    with pytest.raises(ValueError, match="plain"), data_io.output_errors("--out"):
        raise ValueError("plain")  # not a write refusal: left as it is


def test_read_json_refuses_valid_json_of_the_wrong_shape(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    for content in ("[1, 2, 3]", '{"max_len": null}', '{"max_len": true}', '{"other": 1}'):
        path.write_text(content)
        with pytest.raises(DataError, match="expected a JSON object with max_len"):
            read_json(path, "data report", keys={"max_len": int})
    path.write_text('{"max_len": 9}')
    assert read_json(path, "data report", keys={"max_len": int}) == {"max_len": 9}
