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
