"""The explorer's live server under a small HTTP fuzz: malformed lengths, deep JSON,
dropped clients, foreign Host and Origin. Every request gets an answer (or a refusal), the
server keeps serving, and its log holds no traceback."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading

import explore_runs
import pytest

from attnlab.cli import main
from attnlab.explore.server import make_server
from attnlab.explore.sources import load_source
from attnlab.serve.http import allowed_host


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = explore_runs.classifier_run(tmp_path_factory.mktemp("run"))
    srv = make_server(load_source(run), ["好"], {"max_chars": 50, "member": 0}, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def raw(server, request: bytes, read: bool = True) -> tuple[int, bytes]:
    """Send raw bytes; return (status, body) of the answer (status 0: no answer)."""
    with socket.create_connection(server.server_address[:2], timeout=10) as conn:
        conn.sendall(request)
        if not read:
            return 0, b""
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def post(body: bytes, host: str = "127.0.0.1", length: str | None = None, **headers: str):
    lines = [
        "POST /api/explore HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(body) if length is None else length}",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
def log(capsys):
    """The server's stderr during a test, read at the end (its threads print there)."""
    yield lambda: capsys.readouterr().err


def test_malformed_and_hostile_requests_get_an_answer_and_no_traceback(server, log) -> None:
    ok = json.dumps({"inputs": ["好"]}).encode()
    assert raw(server, post(ok))[0] == 200
    cases = {
        "deep JSON": (post(b"[" * 100_000), 400, b"nested too deeply"),
        "deep object": (post(b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"), 400, b""),
        "Content-Length abc": (post(ok, length="abc"), 400, b"not a byte count"),
        "Content-Length -1": (post(ok, length="-1"), 400, b"not a byte count"),
        "Content-Length huge": (post(ok, length=str(10**12)), 413, b"KiB"),
        "Content-Length 4 MiB + 1": (post(ok, length=str(4 * 2**20 + 1)), 413, b""),
        "not JSON": (post(b"nope"), 400, b"error"),
        "not UTF-8": (post(b'{"inputs": ["\xff"]}'), 400, b"error"),
        "a list": (post(b"[1, 2]"), 400, b"JSON object"),
        "inputs of numbers": (post(b'{"inputs": [1]}'), 400, b"inputs"),
        "foreign Host": (post(ok, host="evil.example"), 403, b"not this machine"),
        "rebinding Host with port": (post(ok, host="evil.example:8000"), 403, b""),
        "no Host": (post(ok).replace(b"Host: 127.0.0.1\r\n", b""), 403, b""),
        "foreign Origin": (post(ok, Origin="http://evil.example"), 403, b"not accepted"),
        "null Origin": (post(ok, Origin="null"), 403, b""),
        "cross-site fetch": (post(ok, Sec_Fetch_Site="cross-site"), 403, b"cross-site"),
        "foreign Host GET": (b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403, b""),
        "path traversal": (b"GET /../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404, b""),
    }
    for name, (request, status, needle) in cases.items():
        got, body = raw(server, request)
        assert got == status, (name, got, body[:200])
        assert needle in body, (name, body[:200])
    port = server.server_address[1]
    same = post(ok, host=f"localhost:{port}", Origin=f"http://localhost:{port}")
    assert raw(server, same)[0] == 200
    assert raw(server, post(ok, host=f"[::1]:{port}"))[0] == 200
    assert "Traceback" not in log()


def test_dropped_clients_leave_no_broken_pipe_traceback(server, log) -> None:
    ok = json.dumps({"inputs": ["好" * 40]}).encode()
    for _ in range(5):  # ask, then hang up before the answer
        with socket.create_connection(server.server_address[:2], timeout=10) as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            conn.sendall(post(ok))
    raw(server, post(ok[:5], length=str(len(ok))), read=False)  # a body that never comes
    assert raw(server, post(json.dumps({"inputs": ["好"]}).encode()))[0] == 200
    text = log()
    assert "Traceback" not in text and "BrokenPipe" not in text, text


def test_a_body_that_stalls_short_of_its_length_gets_408(server, monkeypatch, log) -> None:
    monkeypatch.setattr(server.RequestHandlerClass, "read_timeout", 0.5, raising=False)
    ok = json.dumps({"inputs": ["好"]}).encode()
    with socket.create_connection(server.server_address[:2], timeout=10) as conn:
        conn.sendall(post(ok[:5], length=str(len(ok))))  # the rest never comes; no EOF either
        answer = b""
        while chunk := conn.recv(65536):  # the server closes after a refusal
            answer += chunk
    assert answer.split()[1] == b"408" and b"stopped short" in answer, answer[:200]
    assert raw(server, post(ok))[0] == 200  # the server goes on serving
    assert "Traceback" not in log()


def test_allowed_hosts() -> None:
    for host in ("127.0.0.1", "127.0.0.1:80", "localhost:8000", "[::1]:9", "LOCALHOST"):
        assert allowed_host(host, "127.0.0.1"), host
    for host in ("evil.example", "127.0.0.1.evil.example", "", None, "10.0.0.1:80"):
        assert not allowed_host(host, "127.0.0.1"), host
    assert allowed_host("10.0.0.1:80", "10.0.0.1")  # told to listen there


def test_a_port_out_of_range_is_one_line(tmp_path, capsys) -> None:
    run = explore_runs.classifier_run(tmp_path)
    capsys.readouterr()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["explore", str(run), "--serve", "--port", "99999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab: error: --port 99999") and "\n" not in err
    assert main(["explore", str(run), "好", "--out", str(tmp_path)]) == 2  # a folder
    assert "Is a directory" in capsys.readouterr().err
