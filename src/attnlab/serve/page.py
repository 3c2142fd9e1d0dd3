"""The page ``attnlab serve`` answers at ``GET /``: try the classifier from a browser.

A text box; the label and every class's probability (``POST /predict``'s own answer, from the
server's model thread); for a fine-tuned pretrained encoder, which of the text's own pieces
moved the decision (integrated gradients, attnlab.infer.attribution), with ``<s>``, ``</s>``
and e5's ``query: `` prefix shown apart. Chinese and English (a switch). The page is one HTML
file with its script and styles inline, loads nothing from anywhere (its Content-Security-Policy
forbids it) and puts every text into the page as text, never as markup.

``POST /explain`` takes ``{"text": "..."}`` and answers ``{"prediction": {...},
"attribution": {...} | null}``. Attributions run one at a time (a backward pass per path point
costs far more than a prediction), outside the model thread, on the float32 model.
"""

from __future__ import annotations

import json
import re
import threading
from importlib import resources
from typing import Any

from attnlab.data.io import clean_text, is_blank
from attnlab.serve.http import HttpError, JsonHandler

MAX_CHARS = 2000  # characters of one text to explain
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:"
)


def _asset(name: str) -> str:
    return resources.files("attnlab.explore").joinpath("assets", name).read_text("utf-8")


class TryPage:
    """The page and its ``/explain`` answers for one served run (an ``App``)."""

    def __init__(self, app: Any) -> None:
        from attnlab.infer.attribution import explains

        self.app = app
        self.run = app.loaded.run
        self.explains = explains(getattr(self.run, "model", None))
        self.lock = threading.Lock()
        self.html = render(page_data(self.run, app.loaded.labels, self.explains)).encode("utf-8")

    def get(self, handler: JsonHandler) -> None:
        handler.send_body(200, self.html, "text/html; charset=utf-8",
                          **{"Content-Security-Policy": CSP})  # fmt: skip

    def text(self, body: Any) -> str:
        """The text of an explain request, or HttpError naming what to send."""
        if not isinstance(body, dict) or set(body) != {"text"}:
            raise HttpError(400, 'send {"text": "..."} (one text; POST /predict takes many)')
        text = body["text"]
        if not isinstance(text, str) or is_blank(text):
            raise HttpError(400, '"text" must be a non-empty string')
        if len(text) > MAX_CHARS:
            raise HttpError(413, f"the text has {len(text)} characters; send at most {MAX_CHARS}")
        return clean_text(text)

    def explain(self, body: Any) -> dict[str, Any]:
        text = self.text(body)
        (prediction,) = self.app.batcher.predict([text])
        attribution = None
        if self.explains:
            from attnlab.infer.attribution import piece_attribution

            with self.lock:
                attribution = piece_attribution(self.run, text)
        return {"prediction": prediction, "attribution": attribution}


def page_data(run: Any, labels: list[str], explains: bool) -> dict[str, Any]:
    """What the page shows before any request: the model, its labels, a first text."""
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES
    from attnlab.infer.attribution import prompt_prefix
    from attnlab.infer.describe import encoder_name

    tokenizer = getattr(run, "tokenizer", None)
    prefix = prompt_prefix(tokenizer) if tokenizer is not None else ""
    return {
        "encoder": encoder_name(run, "BERT") if explains else None,  # None: the character model
        "run": run.run_dir.name,
        "labels": labels,
        "prefix": prefix,
        "explains": explains,
        "max_chars": MAX_CHARS,
        "example": TUTORIAL_EXAMPLES[2][0],
    }


def render(data: dict[str, Any]) -> str:
    """The self-contained page showing ``data``."""
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")  # no "</script>" inside
    parts = {
        "__CSS__": _asset("explorer.css") + _asset("serve_page.css"),
        "__JS__": _asset("pieces.js") + "\n" + _asset("serve_page.js"),
        "__DATA__": blob,
    }
    return re.sub("|".join(parts), lambda m: parts[m.group(0)], _asset("serve_page.html"))
