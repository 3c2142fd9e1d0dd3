"""Live mode: the explorer page served on 127.0.0.1, answering new inputs with the loaded model.

``GET /`` is the page (with a box for a new text, or an image upload for vision runs);
``POST /api/explore`` takes ``{"inputs": [text]}`` or ``{"image": "data:image/...;base64,..."}``
and returns the page data for it, or ``{"error": message}`` with status 400. The model is loaded
once; one request runs at a time; request bodies are bounded.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.explore.page import explore_data, render_page
from attnlab.explore.sources import Source

MAX_BODY = 4 * 1024 * 1024  # bytes of one request (an uploaded image as a data URL)


def live_info(source: Source, max_chars: int) -> dict[str, Any]:
    """What the page's input box accepts."""
    if source.kind in ("vit", "cnn"):
        return {"accepts": "image", "hint": "upload an image (it is resized to the model's size)"}
    hints = {
        "gpt": "type a prompt; the model continues it",
        "translate": "type a source sentence",
    }
    return {
        "accepts": "text",
        "max_chars": max_chars,
        "hint": hints.get(source.kind, "type a text") + f" (at most {max_chars} characters)",
    }


class Explorer:
    """The loaded model and the options every request uses; one request at a time."""

    def __init__(self, source: Source, options: dict[str, Any]) -> None:
        self.source, self.options = source, options
        self.lock = threading.Lock()

    def data(self, inputs: list[str]) -> dict[str, Any]:
        with self.lock:
            data = explore_data(self.source, inputs, **self.options)
        data["live"] = live_info(self.source, self.options["max_chars"])
        return data

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The page data for one request body; ValueError for bad input."""
        if self.source.kind in ("vit", "cnn"):
            image = body.get("image")
            if not isinstance(image, str) or not image.startswith("data:image/"):
                raise UserError("send an image file (a data:image/... URL in 'image')")
            try:
                raw = base64.b64decode(image.split(",", 1)[1], validate=True)
            except (IndexError, ValueError):
                raise UserError("the image is not valid base64 data") from None
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "upload"
                path.write_bytes(raw)
                data = self.data([str(path)])
            data["examples"][0]["input"] = "uploaded image"
            return data
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            raise UserError("send {'inputs': [text, ...]}")
        if len(inputs) > 8:
            raise UserError(f"at most 8 inputs per request, got {len(inputs)}")
        return self.data(inputs)


def make_handler(explorer: Explorer, first_page: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path not in ("/", "/index.html"):
                self._send(404, b"not found", "text/plain")
                return
            self._send(200, first_page.encode("utf-8"), "text/html; charset=utf-8")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/explore":
                self._send(404, b"not found", "text/plain")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._json(413, {"error": f"request over {MAX_BODY // 1024} KiB; send less"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise UserError("send a JSON object")
                self._json(200, explorer.answer(body))
            except ValueError as err:  # bad input (json.JSONDecodeError is one too)
                self._json(400, {"error": str(err).splitlines()[0]})

        def _json(self, status: int, obj: dict[str, Any]) -> None:
            body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
            self._send(status, body, "application/json; charset=utf-8")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            print(f"explore: {format % args}", file=sys.stderr)

    return Handler


def make_server(
    source: Source, inputs: list[str], options: dict[str, Any], host: str, port: int
) -> ThreadingHTTPServer:
    """A server ready to run (``serve_forever``); port 0 picks a free one."""
    explorer = Explorer(source, options)
    if not inputs and source.kind not in ("vit", "cnn"):
        inputs = [_default_input(source)]
    page = render_page(explorer.data(inputs))
    try:
        return ThreadingHTTPServer((host, port), make_handler(explorer, page))
    except OSError as err:
        raise UserError(
            f"cannot listen on {host}:{port} ({err.strerror}); choose --port"
        ) from None


def _default_input(source: Source) -> str:
    if source.kind == "gpt":
        from attnlab.tasks.lm import default_prompt

        return default_prompt(source.run.tokenizer)
    if source.kind == "classifier":
        return "这部电影看得我热血沸腾，情节紧凑。"
    return "The quick brown fox jumps over the lazy dog."


def serve(source: Source, inputs: list[str], options: dict[str, Any], host: str, port: int) -> None:
    """Serve until interrupted; prints the address."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"explore: listening on {host}: reachable from other machines", file=sys.stderr)
    server = make_server(source, inputs, options, host, port)
    address = server.server_address
    print(f"explorer live at http://{address[0]}:{address[1]}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("explorer stopped", file=sys.stderr)
    finally:
        server.server_close()
