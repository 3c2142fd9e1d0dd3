"""``attnlab serve`` end to end: real HTTP on a free loopback port, the routes and their
numbers, every kind of bad request answered with a clear 4xx, a client stalling in its headers
that holds no one else up, requests arriving together answered from one forward pass, a kill
during requests and a clean restart on the same port."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import attnlab
from attnlab.serve.app import App, make_handler
from attnlab.serve.http import JsonHandler, Server, listen

sys.path.insert(0, str(Path(__file__).parents[1]))
import _runs  # noqa: E402

TEXTS = ["这部电影看得我热血沸腾，情节紧凑。", "剧情拖沓", "好" * 300, "Great film <pad> </s>"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return _runs.e5_run(tmp_path_factory.mktemp("serve") / "run", "mean", max_len=48)


@pytest.fixture
def server(run):
    """An in-process server on a free port: (server, app)."""
    app = App(attnlab.load(run), max_texts=8)
    srv = listen(Server, make_handler(app, "127.0.0.1", 4096), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, app
    srv.shutdown()
    srv.server_close()
    app.batcher.close()


def request(port: int, method: str, path: str, body: object = None, **headers: str):
    """(status, parsed JSON) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
    if data is not None:
        headers.setdefault("Content-Type", "application/json")
    conn.request(method, path, data, headers)
    answer = conn.getresponse()
    status, raw = answer.status, answer.read()
    conn.close()
    return status, json.loads(raw)


def raw(port: int, data: bytes) -> tuple[int, bytes]:
    """Send raw bytes, read to the end: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def post(
    body: bytes, length: str | None = None, kind: str = "application/json", extra: str = ""
) -> bytes:
    lines = ["POST /predict HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {kind}",
             f"Content-Length: {len(body) if length is None else length}"]  # fmt: skip
    lines += [extra] if extra else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_the_routes_answer_the_api_s_numbers(server, run) -> None:
    srv, app = server
    port = srv.server_address[1]
    status, answer = request(port, "POST", "/predict", {"texts": TEXTS})
    assert status == 200
    assert answer["predictions"] == attnlab.load(run).predict(TEXTS)
    assert [p["text"] for p in answer["predictions"]] == TEXTS
    status, health = request(port, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["batches"] >= 1
    status, info = request(port, "GET", "/info")
    assert status == 200 and info["labels"] == ["negative", "positive"]
    assert info["max_len"] == 48 and info["encoder"] == {"name": "a random tiny encoder"}
    assert info["limits"] == {"max_texts": 8, "batch_size": 64, "threads": 1, "path": "fp32"}


def test_bad_requests_get_a_clear_4xx_and_the_server_goes_on(server, capsys) -> None:
    srv, _ = server
    port = srv.server_address[1]
    ok = json.dumps({"texts": ["好"]}).encode()
    cases = {
        "not JSON": (post(b"{texts: "), 400, b"not JSON"),
        "not UTF-8": (post(b'{"texts": ["\xff"]}'), 400, b"not JSON"),
        "deep JSON": (post(b"[" * 4000), 400, b"nested too deeply"),
        "a list": (post(b'["a"]'), 400, b"JSON object"),
        "no texts": (post(b"{}"), 400, b'no \\"texts\\"'),
        "unknown field": (post(b'{"texts": ["a"], "top_k": 2}'), 400, b"top_k"),
        "a string": (post(b'{"texts": "abc"}'), 400, b"list of strings"),
        "numbers": (post(b'{"texts": ["a", 3]}'), 400, b"text 2 is a int"),
        "null": (post(b'{"texts": null}'), 400, b"list of strings"),
        "empty list": (post(b'{"texts": []}'), 400, b"no texts given"),
        "blank text": (post(b'{"texts": ["a", "  "]}'), 400, b"text 2 is empty"),
        "too many texts": (post(json.dumps({"texts": ["a"] * 9}).encode()), 413, b"at most 8"),
        "body too large": (post(ok, length="5000"), 413, b"KiB"),
        "length abc": (post(ok, length="abc"), 400, b"not a byte count"),
        "length -1": (post(ok, length="-1"), 400, b"not a byte count"),
        "text/plain": (post(ok, kind="text/plain"), 415, b"application/json"),
        "form": (post(ok, kind="application/x-www-form-urlencoded"), 415, b""),
        "GET /predict": (b"GET /predict HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405, b"POST"),
        "POST /health": (post(ok).replace(b"/predict", b"/health"), 405, b"GET"),
        "no route": (b"GET /admin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404, b"/predict"),
        "foreign Host": (post(ok).replace(b"127.0.0.1", b"evil.example"), 403, b"not this"),
        "cross-site": (post(ok, extra="Sec-Fetch-Site: cross-site"), 403, b"cross-site"),
        "foreign Origin": (post(ok, extra="Origin: http://evil.example"), 403, b"not accepted"),
    }
    for name, (data, status, needle) in cases.items():
        got, body = raw(port, data)
        assert got == status, (name, got, body[:200])
        assert needle in body and "error" in json.loads(body), (name, body[:200])
    assert raw(port, post(ok))[0] == 200  # still serving
    assert "Traceback" not in capsys.readouterr().err


def answer(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read to the end: (status, headers, body), the body exactly its
    Content-Length long."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(data)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert len(body) == int(headers["Content-Length"]) or data.startswith(b"HEAD"), got[:300]
    return int(lines[0].split()[1]), headers, body


def test_every_method_and_malformed_request_gets_json(server) -> None:
    srv, _ = server
    port = srv.server_address[1]
    host = "Host: 127.0.0.1\r\n"
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"):
        status, headers, body = answer(port, f"{method} /predict HTTP/1.1\r\n{host}\r\n".encode())
        assert status == 405 and headers["Allow"] == "POST", (method, status, body)
        assert "takes POST" in json.loads(body)["error"]
    status, headers, body = answer(port, f"DELETE /health HTTP/1.1\r\n{host}\r\n".encode())
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, body = answer(port, f"HEAD /health HTTP/1.1\r\n{host}\r\n".encode())
    assert status == 200 and body == b"" and headers["Content-Type"].startswith("application/json")
    cases = {  # http.server's own refusals
        "unknown method": (f"BREW /predict HTTP/1.1\r\n{host}\r\n", 501),
        "bad request line": ("GET /predict HTTP/1.1 extra\r\n\r\n", 400),
        "bad version": ("GET /health HTTP/one\r\n\r\n", 400),
        "HTTP/2": ("GET /health HTTP/2.0\r\n\r\n", 505),
        "HTTP/0.9": ("GET /health\r\n\r\n", 403),  # no Host: still a status line
        "long URL": ("GET /" + "a" * 70000 + " HTTP/1.1\r\n\r\n", 414),
        "long header": (f"GET /health HTTP/1.1\r\n{host}X-A: {'a' * 70000}\r\n\r\n", 431),
        "many headers": ("GET /health HTTP/1.1\r\n" + "X-A: a\r\n" * 120 + "\r\n", 431),
    }
    for name, (request_text, expected) in cases.items():
        status, headers, body = answer(port, request_text.encode())
        assert status == expected, (name, status, body[:200])
        assert headers["Content-Type"].startswith("application/json"), (name, headers)
        assert ("error" in json.loads(body)) == (status != 200), (name, body[:200])


def chunked(body: bytes, sizes: list[int], extra: str = "") -> bytes:
    head = ("POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n{extra}\r\n").encode()  # fmt: skip
    parts, at = [], 0
    for size in sizes:
        parts.append(f"{size:x};ext=1\r\n".encode() + body[at : at + size] + b"\r\n")
        at += size
    assert at == len(body)
    return head + b"".join(parts) + b"0\r\nX-Trailer: t\r\n\r\n"


def test_a_chunked_body_is_read_within_the_body_limit(server, run) -> None:
    srv, _ = server
    port = srv.server_address[1]
    body = json.dumps({"texts": TEXTS[:2]}, ensure_ascii=False).encode()
    status, _, got = answer(port, chunked(body, [1, 7, len(body) - 8]))
    assert status == 200, got
    assert json.loads(got)["predictions"] == attnlab.load(run).predict(TEXTS[:2])
    big = json.dumps({"texts": ["好" * 800, "差" * 800]}).encode()  # over the server's 4 KiB
    status, _, got = answer(port, chunked(big, [len(big) // 2, len(big) - len(big) // 2]))
    assert status == 413 and "KiB" in json.loads(got)["error"]
    bad = chunked(body, [len(body)]).replace(f"{len(body):x};".encode(), b"zz;")
    assert answer(port, bad)[0] == 400
    both = chunked(body, [len(body)], extra=f"Content-Length: {len(body)}\r\n")
    assert answer(port, both)[0] == 400
    no_length = (
        b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n"
    )
    status, _, got = answer(port, no_length + body)
    assert status == 411 and "Content-Length" in json.loads(got)["error"]


def test_tgi_s_inputs_are_told_what_to_send(server) -> None:
    srv, _ = server
    port = srv.server_address[1]
    for inputs in ("好看", ["好看", "难看"]):
        status, got = request(port, "POST", "/predict", {"inputs": inputs})
        assert status == 400 and '{"texts": [' in got["error"] and "TGI" in got["error"]
        assert '{"predictions": [' in got["error"]  # the answer's shape differs too


def test_a_client_stalling_in_its_headers_holds_no_one_up(server, monkeypatch) -> None:
    srv, _ = server
    port = srv.server_address[1]
    monkeypatch.setattr(JsonHandler, "head_timeout", 1.0)
    stalled = socket.create_connection(("127.0.0.1", port), timeout=60)
    stalled.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
    assert request(port, "POST", "/predict", {"texts": ["好"]})[0] == 200  # served meanwhile
    assert stalled.recv(1024) == b""  # the server hung up on it at its deadline
    trickle = socket.create_connection(("127.0.0.1", port), timeout=60)
    cut = False
    for byte in b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
        try:  # a byte every 0.1 s for 25 s: each read is quick, the whole head never is
            trickle.sendall(bytes([byte]))
            time.sleep(0.1)
            if select.select([trickle], [], [], 0)[0]:
                cut = trickle.recv(1024) == b""  # the server hung up mid-trickle
        except OSError:  # reset: cut off
            cut = True
        if cut:
            break
    assert cut, "a client trickling its headers was never cut off"
    stalled.close()
    trickle.close()


def test_requests_arriving_together_share_one_forward_pass(server, run) -> None:
    srv, app = server
    port = srv.server_address[1]
    model = app.loaded.run.infer_model  # what predict runs
    passes = []
    hook = model.register_forward_pre_hook(lambda module, args: passes.append(args[0].shape))
    first_in, release = threading.Event(), threading.Event()
    plain = app.batcher.predict_fn

    def gated(texts):  # the first batch waits until the others have queued behind it
        if not first_in.is_set():
            first_in.set()
            release.wait(60)
        return plain(texts)

    app.batcher.predict_fn = gated
    bodies = [[f"第{i}条评论，还不错", "差"] for i in range(7)]
    answers: dict[int, dict] = {}

    def client(i: int, texts: list[str]) -> None:
        answers[i] = request(port, "POST", "/predict", {"texts": texts})[1]

    threads = [threading.Thread(target=client, args=(-1, ["先到的"]))]
    threads[0].start()
    assert first_in.wait(60)
    threads += [threading.Thread(target=client, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads[1:]:
        t.start()
    for _ in range(600):  # the seven queue while the first batch is held
        if app.batcher.waiting() == 7:
            break
        time.sleep(0.1)
    assert app.batcher.waiting() == 7
    release.set()
    for t in threads:
        t.join(60)
    hook.remove()
    assert len(passes) == 2 and passes[1][0] == 14  # the seven requests' 14 texts at once
    alone = attnlab.load(run)
    for i, texts in enumerate(bodies):
        got = answers[i]["predictions"]
        assert [p["text"] for p in got] == texts  # each request gets its own answers
        for ours, single in zip(got, alone.predict(texts)):
            assert ours["label"] == single["label"]
            assert all(abs(ours["probs"][k] - v) < 1e-5 for k, v in single["probs"].items())


def test_forty_clients_connecting_at_once_are_all_answered(server) -> None:
    srv, _ = server
    port = srv.server_address[1]
    statuses: list[object] = []
    go = threading.Barrier(40)

    def client() -> None:
        go.wait()
        try:
            statuses.append(request(port, "POST", "/predict", {"texts": ["好看", "难看"]})[0])
        except OSError as err:  # refused or reset: not answered
            statuses.append(repr(err))

    threads = [threading.Thread(target=client) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses == [200] * 40, statuses


def start(run: Path, port: int = 0) -> tuple[subprocess.Popen, int]:
    """``attnlab serve RUN`` in a child process; (process, port) once it listens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "serve", str(run), "--port", str(port),
         "--precision", "fp32", "--threads", "1"],  # answers compared with fp32's
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(found.group(1))


def same(got: list[dict], expected: list[dict]) -> bool:
    """The same labels and, within float noise (batches of other sizes pad differently),
    the same probabilities."""
    return len(got) == len(expected) and all(
        g["text"] == e["text"] and g["label"] == e["label"]
        and all(abs(g["probs"][k] - v) < 1e-5 for k, v in e["probs"].items())
        for g, e in zip(got, expected)
    )  # fmt: skip


def test_a_kill_during_requests_then_a_clean_restart(run) -> None:
    proc, port = start(run)
    expected = attnlab.load(run).predict(TEXTS)
    outcomes: list[str] = []

    def client() -> None:
        while True:
            try:
                status, answer = request(port, "POST", "/predict", {"texts": TEXTS})
            except (OSError, http.client.HTTPException):
                outcomes.append("cut")
                return
            good = status == 200 and same(answer["predictions"], expected)
            outcomes.append("ok" if good else f"wrong: {status} {answer}")
            if not good:
                return

    clients = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for c in clients:
        c.start()
    for _ in range(1200):  # until each client has had answers, at most a minute
        if outcomes.count("ok") >= 16 or any(o.startswith("wrong") for o in outcomes):
            break
        time.sleep(0.05)
    assert outcomes.count("ok") >= 16, outcomes
    proc.kill()  # SIGKILL mid-requests
    proc.wait(60)
    for c in clients:
        c.join(60)
    assert not any(c.is_alive() for c in clients)  # every client got an answer or an error
    assert outcomes.count("cut") == 8 and not [o for o in outcomes if o.startswith("wrong")]
    proc, again = start(run, port)  # the same port at once
    try:
        assert again == port
        status, answer = request(port, "POST", "/predict", {"texts": TEXTS})
        assert status == 200 and answer["predictions"] == expected  # alone: exactly the API's
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert "serve: stopped" in err and "Traceback" not in err, err
    finally:
        proc.kill()
        proc.wait(60)


def test_bad_settings_and_runs_that_serve_no_texts_are_one_line(run, tmp_path, capsys) -> None:
    from attnlab.cli import main

    for argv, needle in (
        (["--port", "70000"], "--port 70000"),
        (["--threads", "-2"], "threads must be >="),
        (["--max-texts", "0"], "--max-texts must be >= 1"),
        (["--batch-size", "0"], "batch_size must be >= 1"),
        (["--drain", "0"], "--drain 0.0: give seconds from 0.1"),
        (["--drain", "nan"], "--drain nan"),
    ):
        assert main(["serve", str(run), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, err
    assert main(["serve", str(run.parent / "missing")]) == 2
    sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
    import explore_runs

    capsys.readouterr()
    for kind, needle in (("vit", "classifies image files"), ("lm", "cannot predict")):
        other = (explore_runs.vision_run(tmp_path, "vit") if kind == "vit"
                 else explore_runs.gpt_run(tmp_path))  # fmt: skip
        assert main(["serve", str(other)]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, err


def test_the_log_sums_the_answers_unless_each_is_asked_for(run, capsys) -> None:
    from attnlab.serve.app import AccessLog

    app = App(attnlab.load(run))
    for each in (False, True):
        log = AccessLog(each=each, every=3600.0)
        srv = listen(Server, make_handler(app, "127.0.0.1", 4096, log), "127.0.0.1", 0)
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        port = srv.server_address[1]
        try:
            capsys.readouterr()
            for path in ("/health", "/health", "/health", "/nothing", "/nothing"):
                request(port, "GET", path)
            err = capsys.readouterr().err
            assert (err.count('"GET /health HTTP/1.1" 200') == 3) == each, err
            log.flush()
            err = capsys.readouterr().err
            summed = re.search(r"serve: 5 answers in \d+ s \(3 x 200, 2 x 404\)", err)
            assert bool(summed) != each, err
        finally:
            srv.shutdown()
            srv.server_close()
    app.batcher.close()
