"""``attnlab serve RUN``: a trained classifier behind a JSON API.

Routes (every answer JSON; an error is ``{"error": "one line"}``):

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

import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from attnlab.api import LoadedRun, check_texts
from attnlab.data.io import clean_text
from attnlab.errors import UserError
from attnlab.serve.batcher import Batcher, Stopping
from attnlab.serve.http import LOOPBACK, HttpError, JsonHandler, Server, listen

MAX_TEXTS = 256  # texts in one request
MAX_BODY = 1024 * 1024  # bytes of one request
DRAIN_TIMEOUT = 30.0  # seconds a stop waits for the requests being answered


def run_info(loaded: LoadedRun) -> dict[str, Any]:
    """What ``GET /info`` says about the run: its labels and where it comes from."""
    from attnlab.data.io import read_json

    run = loaded.run
    report_path = Path(run.run_dir) / "data_report.json"
    report = read_json(report_path, "data report", keys={}) if report_path.is_file() else {}
    return {
        "run": str(Path(run.run_dir).resolve()),
        "task": run.task,
        "labels": loaded.labels,
        "max_len": getattr(run, "max_len", None),
        "encoder": report.get("checkpoint", "none: trained from scratch"),
        "data": report.get("source"),
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

    def texts(self, body: Any) -> list[str]:
        """The texts of a predict request body, or HttpError naming what is wrong."""
        if not isinstance(body, dict):
            raise HttpError(400, 'send a JSON object: {"texts": ["...", ...]}')
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
        }


def make_handler(app: App, bound: str, max_body: int) -> type[JsonHandler]:
    routes = {"/predict": "POST", "/health": "GET", "/info": "GET"}

    class Handler(JsonHandler):
        name = "serve"

        def route(self, method: str) -> str | None:
            """The path when it takes ``method``, else None (the error answered)."""
            path = self.path.split("?", 1)[0]
            if path not in routes:
                self.send_json(404, {"error": f"no route {path}; use {', '.join(routes)}"})
                return None
            if routes[path] != method:
                self.send_json(405, {"error": f"{path} takes {routes[path]}, not {method}"})
                return None
            return None if self.refused() else path

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.route("GET")
            if path == "/health":
                self.send_json(200, app.health())
            elif path == "/info":
                self.send_json(200, {**app.info, "limits": app.limits()})

        def do_POST(self) -> None:  # noqa: N802
            if self.route("POST") is None:
                return
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            try:
                if kind != "application/json":
                    raise HttpError(415, f"Content-Type {kind or 'none'}; send application/json")
                answer = app.predict(self.read_json())
            except HttpError as err:
                self.send_json(err.status, {"error": str(err)})
                return
            except Stopping as err:
                self.send_json(503, {"error": str(err)})
                return
            except Exception:  # a bug: its traceback in the log, and the client told so
                traceback.print_exc()
                self.send_json(500, {"error": "internal error (a bug): see the server's log"})
                return
            self.send_json(200, answer)

    Handler.bound, Handler.max_body = bound, max_body
    return Handler


class Stop(Exception):
    """SIGTERM: stop serving as Ctrl-C does."""


def _stop(signum: int, frame: Any) -> None:
    raise Stop


def serve(
    loaded: LoadedRun, host: str = "127.0.0.1", port: int = 8000, max_texts: int = MAX_TEXTS,
    max_body: int = MAX_BODY,
) -> None:  # fmt: skip
    """Serve ``loaded`` until Ctrl-C or SIGTERM; prints the address first."""
    app = App(loaded, max_texts)
    server = listen(Server, make_handler(app, host, max_body), host, port)
    if host not in LOOPBACK:
        print(f"serve: listening on {host}: reachable from other machines", file=sys.stderr)
    address = server.server_address
    print(
        f"serving {loaded.run.run_dir} at http://{address[0]}:{address[1]}/ (POST /predict, "
        "GET /health, GET /info; Ctrl-C stops it)",
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, Stop):
        server.socket.close()  # no new connections; those being served are answered
        finished = server.drain(DRAIN_TIMEOUT)
        print(f"serve: stopped{'' if finished else ' (requests still running were cut)'}",
              file=sys.stderr)  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        app.batcher.close()
