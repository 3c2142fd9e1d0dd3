"""``attnlab serve RUN``: a trained classifier behind a JSON API.

Routes (every answer JSON but the page; an error is ``{"error": "one line"}``):

- ``GET /`` -> a page to try the classifier in a browser, ``POST /explain`` with
  ``{"text": "..."}`` -> its label, probabilities and which pieces moved the decision
  (attnlab.serve.page);

- ``POST /predict`` with ``{"texts": ["...", ...]}`` (``Content-Type: application/json``) ->
  ``{"predictions": [...]}``, one object per text in order, the very objects
  ``attnlab predict --json`` prints (``label``, ``probs``, ``unknown_share``, ``truncated``...);
- ``GET /health`` -> ``{"status": "ok", "waiting": requests queued, "batches": forward passes}``;
- ``GET /info`` -> the run: task, labels, how much of a text it reads (``max_len``), the encoder
  it was fine-tuned from and the data it learnt, and this server's limits.

Bad requests get 400 (malformed JSON, a field of the wrong type, no texts, a blank text, an
unknown field), 404 / 405 (route, method), 408 (a body that stops short), 413 (a body over
``max_body`` or more than ``max_texts`` texts), 415 (not JSON), 503 (too many connections at
once). The model runs in one thread (attnlab.serve.batcher): requests that arrive together
are classified in one forward pass. The HTTP side is attnlab.serve.http (why the standard
library: its docstring). It listens on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.api import LoadedRun, check_texts
from attnlab.data.io import clean_text
from attnlab.errors import UserError
from attnlab.serve.batcher import Batcher, Stopping
from attnlab.serve.http import LOOPBACK, HttpError, JsonHandler, Server, listen
from attnlab.serve.page import TryPage

MAX_TEXTS = 256  # texts in one request
MAX_BODY = 1024 * 1024  # bytes of one request
DRAIN_TIMEOUT = 30.0  # seconds a stop waits for the requests being answered


def without_paths(value: Any) -> Any:
    """``value`` with every file path in its strings cut to the file's name: what the run read
    is told by name, never by where it lay on the training machine."""
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    if isinstance(value, str):  # sources joined with " + " (data.splits), each maybe a path
        return " + ".join(_name(part) for part in value.split(" + "))
    return value


def _name(text: str) -> str:
    if re.match(r"(?:[A-Za-z]:)?[/\\]", text):  # the whole text one path (spaces and all)
        return re.split(r"[/\\]", text.rstrip("/\\"))[-1]
    return PATH.sub(lambda m: re.split(r"[/\\]", m.group().rstrip("/\\"))[-1], text)


# an absolute path: /a/b.csv, C:\a\b (not a name such as intfloat/multilingual-e5-small)
PATH = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?(?:[/\\][^\s/\\,;:()]+)+[/\\]?")


def encoder_info(report: dict[str, Any]) -> dict[str, Any]:
    """The encoder a run was fine-tuned from, as training recorded it (data_report.json's
    "encoder": its name, family and where model, weights and tokenizer come from)."""
    encoder = report.get("encoder")
    if isinstance(encoder, dict):
        return without_paths(encoder)
    if "checkpoint" in report:  # a run folder written before "encoder" was recorded
        return {"name": without_paths(str(report["checkpoint"]))}
    return {"name": "none: the character model, trained from scratch on the data below"}


def data_info(report: dict[str, Any]) -> dict[str, Any]:
    """What the run learnt: its corpus and the extra training sets, by name, with the size of
    each split."""
    extra = (report.get("extra_training") or {}).get("sources") or {}
    named = {name: entry.get("source") for name, entry in extra.items()}
    data = {"source": report.get("source"), "split_sizes": report.get("split_sizes")}
    return without_paths({**data, "extra_training": named})


def run_info(loaded: LoadedRun) -> dict[str, Any]:
    """What ``GET /info`` says about the run: its labels, how much of a text it reads and
    where it comes from (names only: no path of the machine it was trained on)."""
    from attnlab.data.io import read_json

    run = loaded.run
    report_path = Path(run.run_dir) / "data_report.json"
    report = read_json(report_path, "data report", keys={}) if report_path.is_file() else {}
    return {
        "run": Path(run.run_dir).resolve().name,
        "task": run.task,
        "labels": loaded.labels,
        "max_len": report.get("max_len"),  # the length the run was trained at
        "read_len": getattr(run, "max_len", None),  # the length predict reads
        "encoder": encoder_info(report),
        "data": data_info(report),
    }


class App:
    """The loaded run, its model thread and the limits every request is held to."""

    def __init__(self, loaded: LoadedRun, max_texts: int = MAX_TEXTS) -> None:
        loaded.run.require("predict")
        if not hasattr(loaded.run, "tokenizer"):  # its inputs are file paths on this machine
            raise UserError(
                f"{loaded.run.run_dir} classifies image files; serve answers texts (use "
                "attnlab predict or attnlab.load for images)"
            )
        self.loaded, self.max_texts = loaded, max_texts
        self.batcher = Batcher(loaded.predict, loaded.batch_size)
        self.info = run_info(loaded)
        self.log = AccessLog()

    def texts(self, body: Any) -> list[str]:
        """The texts of a predict request body, or HttpError naming what is wrong."""
        if not isinstance(body, dict):
            raise HttpError(400, 'send a JSON object: {"texts": ["...", ...]}')
        if "inputs" in body and "texts" not in body:  # TGI / TEI's shape
            raise HttpError(
                400,
                '"inputs" is TGI / TEI\'s request; this server takes {"texts": ["...", ...]} '
                'and answers {"predictions": [...]}',
            )
        unknown = sorted(set(body) - {"texts"})
        if unknown:
            raise HttpError(400, f'unknown field(s) {unknown}; send {{"texts": ["...", ...]}}')
        if "texts" not in body:
            raise HttpError(400, 'no "texts"; send {"texts": ["...", ...]}')
        texts = body["texts"]
        if isinstance(texts, list) and len(texts) > self.max_texts:
            raise HttpError(413, f"{len(texts)} texts; send at most {self.max_texts} a request")
        try:
            texts = check_texts(texts)
        except UserError as err:
            raise HttpError(400, str(err)) from None
        return [clean_text(t) for t in texts]  # "\ud800" in JSON: U+FFFD

    def predict(self, body: Any) -> dict[str, Any]:
        return {"predictions": self.batcher.predict(self.texts(body))}

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "waiting": self.batcher.waiting(), "batches": self.batcher.batches}

    def limits(self) -> dict[str, Any]:
        return {
            "max_texts": self.max_texts,
            "batch_size": self.loaded.batch_size,
            "threads": self.loaded.threads,
            "path": getattr(self.loaded.inference_path, "name", None),
        }


Route = Callable[[JsonHandler], None]  # answers one request through its handler


def routes(app: App) -> dict[str, dict[str, Route]]:
    """Path -> method -> what answers it. A known path asked with another method is 405 with
    an ``Allow`` header, any other path 404; add a route by adding an entry."""
    page = TryPage(app)  # serve.page: the page at / and what it asks
    return {
        "/": {"GET": page.get},
        "/explain": {"POST": lambda h: h.send_json(200, page.explain(json_body(h)))},
        "/predict": {"POST": lambda h: h.send_json(200, app.predict(json_body(h)))},
        "/health": {"GET": lambda h: h.send_json(200, app.health())},
        "/info": {"GET": lambda h: h.send_json(200, {**app.info, "limits": app.limits()})},
    }


def json_body(handler: JsonHandler) -> Any:
    """A request's JSON body; 415 unless it says it is JSON."""
    kind = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise HttpError(415, f"Content-Type {kind or 'none'}; send application/json")
    return handler.read_json()


class AccessLog:
    """Answers by status, summed into one line every ``every`` seconds (written when the next
    answer or the stop comes); ``each``: a line per request instead."""

    def __init__(self, each: bool = False, every: float = 60.0) -> None:
        self.each, self.every = each, every
        self.counts: dict[int, int] = {}
        self.since = time.monotonic()
        self.lock = threading.Lock()

    def count(self, status: int) -> None:
        with self.lock:
            self.counts[status] = self.counts.get(status, 0) + 1
            if time.monotonic() - self.since >= self.every:
                self.flush_locked()

    def flush(self) -> None:
        with self.lock:
            self.flush_locked()

    def flush_locked(self) -> None:
        if self.counts:
            seconds = time.monotonic() - self.since
            parts = ", ".join(f"{n} x {code}" for code, n in sorted(self.counts.items()))
            print(f"serve: {sum(self.counts.values())} answers in {seconds:.0f} s ({parts})",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.counts, self.since = {}, time.monotonic()


def make_handler(
    app: App, bound: str, max_body: int, log: AccessLog | None = None
) -> type[JsonHandler]:
    table = routes(app)
    log = log or AccessLog()

    class Handler(JsonHandler):
        name = "serve"

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            if log.each:
                super().log_request(code, size)
            else:
                log.count(int(code))

        def answer(self) -> None:
            """Dispatch through ``table``; every refusal and failure is a JSON error."""
            path = self.path.split("?", 1)[0]
            if path not in table:
                self.send_json(404, {"error": f"no route {path}; use {', '.join(table)}"})
                return
            methods = dict(table[path])
            if "GET" in methods:  # HEAD: GET's answer without its body (send_body)
                methods.setdefault("HEAD", methods["GET"])
            if self.command not in methods:
                allow = ", ".join(methods)
                self.send_json(405, {"error": f"{path} takes {allow}, not {self.command}"},
                               Allow=allow)  # fmt: skip
                return
            if self.refused():
                return
            try:
                methods[self.command](self)
            except HttpError as err:
                self.send_json(err.status, {"error": str(err)})
            except Stopping as err:
                self.send_json(503, {"error": str(err)})
            except ConnectionError:  # the client went away, or the server stopped: no answer
                raise
            except Exception:  # a bug: its traceback in the log, and the client told so
                traceback.print_exc()
                self.send_json(500, {"error": "internal error (a bug): see the server's log"})

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = answer  # noqa: N815
        do_OPTIONS = do_TRACE = do_CONNECT = answer  # noqa: N815 - http.server's names
        # any other method: http.server's 501, in JSON (JsonHandler.send_error)

    Handler.bound, Handler.max_body = bound, max_body
    return Handler


class Signals:
    """SIGINT and SIGTERM while serving, counted. The handler raises nothing into the frame the
    signal interrupts (a request's thread, a connection being handed over, a lock): the main
    thread polls the count, so where a signal lands never matters."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1


def stop_when_told(server: Server, app: App, signals: Signals, drain: float) -> bool:
    """Serve until a signal; then accept no more, let the requests being answered finish for
    up to ``drain`` seconds (a second signal: at once), answer those still waiting for the
    model 503, and return by the deadline with every answer begun written whole. Whether the
    model thread is still inside a forward pass (whose answer nobody waits for)."""
    accept = threading.Thread(target=server.serve_forever, name="attnlab-accept", daemon=True)
    accept.start()
    while not signals.count and accept.is_alive():
        time.sleep(0.1)
    began = time.monotonic()
    deadline, grace = began + drain, min(2.0, drain / 3)
    print(f"serve: stopping: answering the requests in flight (up to {drain:g} s; Ctrl-C "
          "again stops at once)", file=sys.stderr, flush=True)  # fmt: skip
    server.shutdown()  # the accept loop ends within its poll interval
    server.socket.close()  # no new connections
    finished = server.drain(deadline - grace, lambda: signals.count > 1)
    cut = 0
    if not finished:
        if signals.count > 1:
            deadline = min(deadline, time.monotonic() + grace)
        cut = app.batcher.cut()  # requests waiting for the model: 503 now
        server.drain(deadline - grace / 2)  # time to write those 503s
    server.close_answers(deadline - time.monotonic())
    left = server.active  # connections still sending their request: closed unanswered
    app.batcher.close(0 if cut or left else max(deadline - time.monotonic(), 0))
    app.log.flush()
    how = "every request answered" if finished else (
        f"{cut} request(s) still running answered 503"
        + (f", {left} connection(s) still sending closed" if left else ""))  # fmt: skip
    print(f"serve: stopped after {time.monotonic() - began:.1f} s ({how})", file=sys.stderr)
    return app.batcher.thread.is_alive()


def serve(
    loaded: LoadedRun, host: str = "127.0.0.1", port: int = 8000, max_texts: int = MAX_TEXTS,
    max_body: int = MAX_BODY, drain: float = DRAIN_TIMEOUT, access_log: bool = False,
) -> bool:  # fmt: skip
    """Serve ``loaded`` until Ctrl-C or SIGTERM; prints the address first. Whether the model
    is still inside a forward pass that was cut (a process should exit without waiting for
    it: Python's exit would wait for the pass to end)."""
    app = App(loaded, max_texts)
    app.log = AccessLog(each=access_log)
    server = listen(Server, make_handler(app, host, max_body, app.log), host, port)
    if host not in LOOPBACK:
        print(f"serve: listening on {host}: reachable from other machines", file=sys.stderr)
    address = server.server_address
    signals = Signals()
    previous = {sig: signal.signal(sig, signals) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(
        f"serving {loaded.run.run_dir} at http://{address[0]}:{address[1]}/ (POST /predict, "
        "GET /health, GET /info; Ctrl-C stops it)",
        flush=True,
    )
    try:
        return stop_when_told(server, app, signals, drain)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()
