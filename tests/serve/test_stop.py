"""Stopping ``attnlab serve`` under any timing: SIGTERM and SIGINT sent to this very process
while ``serve()`` runs in its main thread (where Python runs signal handlers), with clients
opening connections, while a batch runs, and while a request outlives the drain; every answer
a client gets must be whole JSON (200 or 503) or a connection refused / closed before any
byte, and ``serve()`` must return. Then, in a child process, a second Ctrl-C during the stop.

Rounds: 12 of the connection storm (6 SIGTERM, 6 SIGINT, each at a random moment), 4 with a
batch running, 4 with a request that outlives a 1 s drain: about 30 s on a loaded 2-core
machine."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import attnlab
from attnlab.serve import app as app_module
from attnlab.serve.app import Signals, serve

sys.path.insert(0, str(Path(__file__).parents[1]))
import _runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PREDICT = json.dumps({"texts": ["这部电影看得我热血沸腾", "剧情拖沓"]}, ensure_ascii=False)
REQUESTS = {
    "health": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "predict": (
        "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(PREDICT.encode())}\r\n\r\n{PREDICT}"
    ).encode(),
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return attnlab.load(_runs.e5_run(tmp_path_factory.mktemp("stop") / "run", max_len=32))


def outcome(port: int, data: bytes) -> str | int:
    """One request on a new connection: its status when the answer is whole JSON, "refused"
    / "closed" when the server took or answered nothing, else "broken: ..."."""
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
            conn.sendall(data)
            while chunk := conn.recv(65536):
                got += chunk
    except ConnectionRefusedError:
        return "refused"
    except OSError as err:  # reset or a broken pipe: clean only before any byte of an answer
        if got:
            return f"broken: {err!r} after {got[:80]!r}"
    if not got:
        return "closed"
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    try:
        status = int(lines[0].split()[1])
        assert len(body) == int(headers["Content-Length"])
        answer = json.loads(body)
        assert status in (200, 503) and (status == 200) == ("error" not in answer)
    except (AssertionError, IndexError, KeyError, ValueError) as err:
        return f"broken: {err!r} in {got[:200]!r}"
    return status


def run_serve(monkeypatch, loaded, drive, **settings) -> None:
    """``serve(loaded)`` in this (the main) thread while ``drive(port)`` runs in another,
    which sends the signals; returns when serve() does."""
    ready = threading.Event()
    found: dict = {}
    real = app_module.listen

    def listen(*args):
        found["server"] = real(*args)
        ready.set()
        return found["server"]

    monkeypatch.setattr(app_module, "listen", listen)

    def driver() -> None:
        assert ready.wait(60)
        while not isinstance(signal.getsignal(signal.SIGTERM), Signals):
            time.sleep(0.01)  # serve's handlers are in place
        drive(found["server"].server_address[1])

    helper = threading.Thread(target=driver, daemon=True)
    helper.start()
    serve(loaded, port=0, **settings)
    helper.join(120)
    assert not helper.is_alive()


class Clients:
    """Threads that each send ``kind`` requests on new connections until told to stop."""

    def __init__(self, port: int, kinds: list[str]) -> None:
        self.outcomes: list[str | int] = []
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.loop, args=(port, k)) for k in kinds]
        for t in self.threads:
            t.start()

    def loop(self, port: int, kind: str) -> None:
        while not self.done.is_set():
            self.outcomes.append(outcome(port, REQUESTS[kind]))

    def stop(self) -> list[str | int]:
        self.done.set()
        for t in self.threads:
            t.join(120)
        return self.outcomes


def broken(outcomes: list[str | int]) -> list[str]:
    return [o for o in outcomes if isinstance(o, str) and o.startswith("broken")]


@pytest.mark.parametrize("round_", range(12))
def test_a_signal_while_clients_connect_stops_it_and_every_answer_is_whole(
    monkeypatch, capsys, loaded, seed, round_
) -> None:
    signum = (signal.SIGTERM, signal.SIGINT)[round_ % 2]
    delay = random.Random(seed).uniform(0.05, 0.5)
    clients: list[Clients] = []

    def drive(port: int) -> None:
        clients.append(Clients(port, ["health"] * 6 + ["predict"] * 2))
        time.sleep(delay)
        os.kill(os.getpid(), signum)

    run_serve(monkeypatch, loaded, drive)  # returns: the signal was not swallowed
    outcomes = clients[0].stop()
    err = capsys.readouterr().err
    assert not broken(outcomes), broken(outcomes)
    assert 200 in outcomes and "Traceback" not in err, err
    # no request runs for long here: a connection count left off by one would hold the
    # stop to its 30 s drain and call requests cut
    assert "every request answered" in err, err


@pytest.mark.parametrize("round_", range(4))
def test_a_signal_while_a_batch_runs_lets_it_finish(monkeypatch, capsys, loaded, round_) -> None:
    signum = (signal.SIGTERM, signal.SIGINT)[round_ % 2]
    entered = threading.Event()
    real = loaded.predict

    def slow(texts):  # a batch that takes a while
        entered.set()
        time.sleep(0.5)
        return real(texts)

    monkeypatch.setattr(loaded, "predict", slow)
    clients: list[Clients] = []

    def drive(port: int) -> None:
        clients.append(Clients(port, ["predict"] * 4))
        assert entered.wait(60)
        os.kill(os.getpid(), signum)

    run_serve(monkeypatch, loaded, drive, drain=20.0)
    outcomes = clients[0].stop()
    err = capsys.readouterr().err
    assert not broken(outcomes) and outcomes.count(200) >= 1, outcomes
    assert 503 not in outcomes and "every request answered" in err, (outcomes, err)


@pytest.mark.parametrize("round_", range(4))
def test_a_request_outliving_the_drain_gets_a_whole_503(monkeypatch, capsys, loaded, round_):
    signum = (signal.SIGTERM, signal.SIGINT)[round_ % 2]
    entered, release = threading.Event(), threading.Event()
    real = loaded.predict

    def stuck(texts):  # a batch that runs past any deadline
        entered.set()
        release.wait(120)
        return real(texts)

    monkeypatch.setattr(loaded, "predict", stuck)
    clients: list[Clients] = []

    def drive(port: int) -> None:
        clients.append(Clients(port, ["predict"] * 3 + ["health"]))
        assert entered.wait(60)
        time.sleep(0.1 * round_)  # others queue behind the stuck batch
        os.kill(os.getpid(), signum)

    try:
        run_serve(monkeypatch, loaded, drive, drain=1.0)
    finally:
        release.set()
    outcomes = clients[0].stop()
    err = capsys.readouterr().err
    assert not broken(outcomes), broken(outcomes)
    assert 503 in outcomes, outcomes  # the stuck request: answered, whole
    assert re.search(r"\d+ request\(s\) still running answered 503", err), err


def test_a_second_ctrl_c_stops_at_once_with_the_server_s_own_words(tmp_path) -> None:
    run = _runs.e5_run(tmp_path / "run", max_len=32)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "serve", str(run), "--port", "0",
         "--precision", "fp32", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", proc.stdout.readline()).group(1))
        stalled = socket.create_connection(("127.0.0.1", port), timeout=60)
        stalled.sendall(b"POST /predict HTTP/1.1\r\n")  # holds the drain: its head never ends
        time.sleep(0.5)  # accepted
        proc.send_signal(signal.SIGINT)
        before = [proc.stderr.readline()]  # start-up lines, then the stop's
        while "serve: stopping" not in before[-1] and before[-1]:
            before.append(proc.stderr.readline())
        assert "serve: stopping" in before[-1], before
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert "resume" not in err and "Traceback" not in err, err
        assert "serve: stopped" in err and "1 connection(s) still sending closed" in err, err
        stalled.close()
    finally:
        proc.kill()
        proc.wait(60)
