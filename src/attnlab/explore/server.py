"""Live mode: the explorer page served on 127.0.0.1, answering new inputs with the loaded model.

``GET /`` is the page (with a box for a new text, or an image upload for vision runs);
``POST /api/explore`` takes ``{"inputs": [text]}`` or ``{"image": "data:image/...;base64,..."}``
and returns the page data for it, or ``{"error": message}`` with status 400. The model is loaded
once; one request runs at a time; request bodies are bounded.

Only this machine's browser may use it: a request must name a loopback host in ``Host`` (a web
page cannot reach the server through DNS rebinding) and, when it says where it comes from
(``Origin``, ``Sec-Fetch-Site``), come from the page itself. A client that goes away
mid-answer is dropped without a traceback.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from attnlab.data.io import clean_text
from attnlab.errors import UserError
from attnlab.explore.page import explore_data, render_page
from attnlab.explore.sources import Source

MAX_BODY = 4 * 1024 * 1024  # bytes of one request (an uploaded image as a data URL)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
READ_TIMEOUT = 30.0  # seconds a request body may stall before the answer is 408


def host_name(header: str) -> str:
    """The host of a ``Host`` header or an origin's authority, without port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_host(header: str | None, bound: str) -> bool:
    """A loopback Host (or the address the server was told to listen on)."""
    if not header:
        return False
    name = host_name(header)
    return name in LOOPBACK or (bound not in ("", "0.0.0.0", "::") and name == bound.lower())


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
        return self.data([clean_text(t) for t in inputs])  # "\ud800" in JSON: U+FFFD


def make_handler(
    explorer: Explorer, first_page: str, bound: str = "127.0.0.1"
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        read_timeout = READ_TIMEOUT  # seconds a client may stall inside a body

        def refused(self) -> bool:
            """Answer 403 to a request from anywhere but this machine's own page."""
            host = self.headers.get("Host")
            why = None
            if not allowed_host(host, bound):
                why = f"host {host!r} is not this machine; open the page at 127.0.0.1"
            origin = self.headers.get("Origin")
            if why is None and origin is not None:
                authority = origin.split("://", 1)[-1]
                if origin == "null" or host_name(authority) != host_name(host or ""):
                    why = f"requests from {origin} are not accepted; use the page itself"
            site = self.headers.get("Sec-Fetch-Site", "same-origin")
            if why is None and site not in ("same-origin", "none"):
                why = "cross-site requests are not accepted; use the page itself"
            if why is not None:
                self._json(403, {"error": why})
            return why is not None

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.refused():
                return
            if self.path not in ("/", "/index.html"):
                self._send(404, b"not found", "text/plain")
                return
            self._send(200, first_page.encode("utf-8"), "text/html; charset=utf-8")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/explore":
                self._send(404, b"not found", "text/plain")
                return
            if self.refused():
                return
            text = (self.headers.get("Content-Length") or "0").strip()
            # ASCII digits only ("²" is a digit to str.isdigit), and few: int() refuses 4300+
            if not (text.isascii() and text.isdigit() and len(text) <= 18):
                self._json(400, {"error": f"Content-Length {text[:20]!r} is not a byte count"})
                return
            length = int(text)
            if length > MAX_BODY:
                self._json(413, {"error": f"request over {MAX_BODY // 1024} KiB; send less"})
                return
            self.connection.settimeout(self.read_timeout)
            try:
                data = self.rfile.read(length)
            except TimeoutError:  # fewer bytes than Content-Length, and the client waits
                self._json(408, {"error": f"the body stopped short of its {length} bytes"})
                return
            finally:
                self.connection.settimeout(None)
            try:
                body = json.loads(data or b"{}")
            except (ValueError, RecursionError) as err:  # JSONDecodeError, undecodable bytes
                deep = isinstance(err, RecursionError)
                self._json(400, {"error": "the JSON is nested too deeply" if deep else str(err)})
                return
            try:
                if not isinstance(body, dict):
                    raise UserError("send a JSON object")
                answer = explorer.answer(body)
            except UserError as err:  # bad input
                self._json(400, {"error": str(err).splitlines()[0]})
                return
            except Exception:  # a bug: its traceback in the log, and the client told so
                traceback.print_exc()
                self._json(500, {"error": "internal error (a bug): see the server's log"})
                return
            self._json(200, answer)

        def _json(self, status: int, obj: dict[str, Any]) -> None:
            body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
            self._send(status, body, "application/json; charset=utf-8")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if status >= 400:
                self.close_connection = True  # a refused body may still be in flight
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            print(f"explore: {format % args}", file=sys.stderr)

    return Handler


class Server(ThreadingHTTPServer):
    """The explorer's HTTP server: a client that goes away is not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, reset, aborted
            return
        super().handle_error(request, client_address)


def make_server(
    source: Source, inputs: list[str], options: dict[str, Any], host: str, port: int
) -> ThreadingHTTPServer:
    """A server ready to run (``serve_forever``); port 0 picks a free one."""
    explorer = Explorer(source, options)
    if not inputs and source.kind not in ("vit", "cnn"):
        inputs = [_default_input(source)]
    page = render_page(explorer.data(inputs))
    try:
        return Server((host, port), make_handler(explorer, page, host))
    except OSError as err:
        raise UserError(f"cannot listen on {host}:{port} ({err.strerror}); choose --port") from None


def _default_input(source: Source) -> str:
    if source.kind == "gpt":
        from attnlab.infer.lm import default_prompt

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
