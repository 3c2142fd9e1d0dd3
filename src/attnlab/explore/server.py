"""Live mode: the explorer page served on 127.0.0.1, answering new inputs with the loaded model.

``GET /`` is the page (with a box for a new text, or an image upload for vision runs);
``POST /api/explore`` takes ``{"inputs": [text]}`` or ``{"image": "data:image/...;base64,..."}``
and returns the page data for it, or ``{"error": message}`` with status 400. The model is loaded
once; one request runs at a time; request bodies are bounded.

Only this machine's browser may use it: a request must name a loopback host in ``Host`` (a web
page cannot reach the server through DNS rebinding) and, when it says where it comes from
(``Origin``, ``Sec-Fetch-Site``), come from the page itself. The HTTP side (deadlines for a
request's arrival, bounded bodies and connections, JSON errors) is attnlab.serve.http, which
``attnlab serve`` shares.
"""

from __future__ import annotations

import base64
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from attnlab.data.io import clean_text
from attnlab.errors import UserError
from attnlab.explore.page import explore_data, render_page
from attnlab.explore.sources import Source
from attnlab.serve.http import LOOPBACK, HttpError, JsonHandler, Server, listen

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
        return self.data([clean_text(t) for t in inputs])  # "\ud800" in JSON: U+FFFD


def make_handler(
    explorer: Explorer, first_page: str, bound: str = "127.0.0.1"
) -> type[JsonHandler]:
    class Handler(JsonHandler):
        name = "explore"
        max_body = MAX_BODY

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.refused(page_only=True):
                return
            if self.path not in ("/", "/index.html"):
                self.send_body(404, b"not found", "text/plain")
                return
            self.send_body(200, first_page.encode("utf-8"), "text/html; charset=utf-8")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/explore":
                self.send_body(404, b"not found", "text/plain")
                return
            if self.refused(page_only=True):
                return
            try:
                body = self.read_json()
                if not isinstance(body, dict):
                    raise UserError("send a JSON object")
                answer = explorer.answer(body)
            except HttpError as err:
                self.send_json(err.status, {"error": str(err)})
                return
            except UserError as err:  # bad input
                self.send_json(400, {"error": str(err).splitlines()[0]})
                return
            except Exception:  # a bug: its traceback in the log, and the client told so
                traceback.print_exc()
                self.send_json(500, {"error": "internal error (a bug): see the server's log"})
                return
            self.send_json(200, answer)

    Handler.bound = bound
    return Handler


def make_server(
    source: Source, inputs: list[str], options: dict[str, Any], host: str, port: int
) -> Server:
    """A server ready to run (``serve_forever``); port 0 picks a free one."""
    explorer = Explorer(source, options)
    if not inputs and source.kind not in ("vit", "cnn"):
        inputs = [_default_input(source)]
    page = render_page(explorer.data(inputs))
    return listen(Server, make_handler(explorer, page, host), host, port)


def _default_input(source: Source) -> str:
    if source.kind == "gpt":
        from attnlab.infer.lm import default_prompt

        return default_prompt(source.run.tokenizer)
    if source.kind == "classifier" or hasattr(source.run, "predict"):  # the turned sentence
        from attnlab.data.sentiment import TUTORIAL_EXAMPLES

        return TUTORIAL_EXAMPLES[2][0]
    return "The quick brown fox jumps over the lazy dog."


def serve(source: Source, inputs: list[str], options: dict[str, Any], host: str, port: int) -> None:
    """Serve until interrupted; prints the address."""
    if host not in LOOPBACK:
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
