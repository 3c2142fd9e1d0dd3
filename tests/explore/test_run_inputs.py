"""Inputs at the edge of the run verbs and the explorer: text that is not Unicode (bytes the
shell passed that are not UTF-8, a lone surrogate in JSON), Content-Length that int() refuses,
and decompression bombs (a small PNG whose header claims 20000 × 20000 pixels)."""

from __future__ import annotations

import base64
import io
import json
import struct
import sys
import threading
import zlib
from pathlib import Path

import explore_runs
import pytest
from test_server import post, raw

from attnlab.cli import main
from attnlab.explore.server import make_server
from attnlab.explore.sources import load_source

# what Python makes of the bytes \xff\xfe and \xed\xa0\x80 on the command line (surrogateescape)
NOT_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape") + "好"
ENCODED_SURROGATE = b"\xed\xa0\x80".decode("utf-8", "surrogateescape")


def bomb_png(path: Path, width: int = 20_000, height: int = 20_000) -> Path:
    """A PNG of a few dozen bytes whose header claims ``width`` × ``height`` grey pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat)
    path.write_bytes(png + chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "classifier": explore_runs.classifier_run(root),
        "gpt": explore_runs.gpt_run(root),
        "translate": explore_runs.translate_run(root),
        "vit": explore_runs.vision_run(root, "vit"),
    }


def one_line(capsys, argv: list[str], *needles: str) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith("attnlab: error:") and all(n in err for n in needles), err
    return err


# ---------------------------------------------------------------------------- text not Unicode


def test_bytes_that_are_not_utf8_read_as_replacement_characters(runs, tmp_path, capsys) -> None:
    run = runs["classifier"]
    assert main(["predict", str(run), "--json", NOT_UTF8]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "\ufffd\ufffd好"
    page = tmp_path / "page.html"
    assert main(["explore", str(run), NOT_UTF8, "--out", str(page)]) == 0
    assert "\ufffd\ufffd好" in page.read_text(encoding="utf-8")
    assert main(["translate", str(runs["translate"]), f"{ENCODED_SURROGATE} the cat"]) == 0
    capsys.readouterr()
    gpt = str(runs["gpt"])
    assert main(["generate", gpt, "--prompt", "To be", "--stop", ENCODED_SURROGATE,
                 "--max-new-tokens", "3"]) == 0  # fmt: skip
    one_line(capsys, ["generate", gpt, "--prompt", ENCODED_SURROGATE], "'\ufffd'", "vocabulary")


def test_stdin_that_is_not_utf8_reads_as_replacement_characters(runs, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe\xe5\xa5\xbd\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)  # strict: reading it as text would raise
    assert main(["predict", str(runs["classifier"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "\ufffd\ufffd好"


# ---------------------------------------------------------------------------- the live server


@pytest.fixture(scope="module")
def servers(runs):
    started = {}
    for kind in ("classifier", "vit"):
        inputs = ["好"] if kind == "classifier" else []
        srv = make_server(load_source(runs[kind]), inputs, {"max_chars": 50, "member": 0},
                          "127.0.0.1", 0)  # fmt: skip
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started[kind] = srv
    yield started
    for srv in started.values():
        srv.shutdown()
        srv.server_close()


def test_the_server_answers_odd_lengths_surrogates_and_bombs(servers, tmp_path, capsys) -> None:
    text = servers["classifier"]
    ok = json.dumps({"inputs": ["好"]}).encode()
    superscript = post(ok, length="LENGTH").replace(b"LENGTH", b"\xb2")  # "²": a digit to isdigit
    for request in (superscript, post(ok, length="0" * 5000), post(ok, length="١٢")):
        status, body = raw(text, request)
        assert status == 400 and b"not a byte count" in body, (status, body[:200])
    status, body = raw(text, post(b'{"inputs": ["\\ud800x"]}'))
    assert status == 200, body[:200]
    assert json.loads(body)["examples"][0]["input"] == "\ufffdx"
    png = base64.b64encode(bomb_png(tmp_path / "bomb.png").read_bytes()).decode()
    body = json.dumps({"image": f"data:image/png;base64,{png}"}).encode()
    status, answer = raw(servers["vit"], post(body))
    assert status == 400 and b"image too large" in answer, (status, answer[:200])
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- decompression bombs


@pytest.mark.parametrize("size", [(20_000, 20_000), (9_000, 9_000)])
def test_a_decompression_bomb_is_one_line(size, runs, tmp_path, capsys) -> None:
    bomb = bomb_png(tmp_path / "bomb.png", *size)
    assert bomb.stat().st_size < 200
    run = runs["vit"]
    one_line(capsys, ["predict", str(run), str(bomb)], "bomb.png", "image too large")
    out = tmp_path / "page.html"
    one_line(capsys, ["explore", str(run), str(bomb), "--out", str(out)], "image too large")
    one_line(capsys, ["attention", str(run), str(bomb), "--out", str(tmp_path / "a.png")],
             "image too large")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.png"]
