"""The explorer page: one HTML file with its data, script and styles inline.

:func:`explore_data` runs the model on the inputs and returns the page's data, drawn by the page
``source.kind`` names (a run's ``Run.explore_page``: the explorer knows pages, not tasks);
:func:`render_page` puts data, ``assets/explorer.js`` and ``assets/explorer.css`` into
``assets/page.html``. The page loads nothing from anywhere (its Content-Security-Policy forbids
it) and opens from disk.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from attnlab.explore.sources import Source

FORMAT_VERSION = 1


def explore_data(
    source: Source,
    inputs: list[str],
    *,
    max_chars: int = 5000,
    member: int = 0,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    seed: int = 0,
    beam_size: int | None = None,
) -> dict[str, Any]:
    """The page's data for ``inputs`` (texts, prompts, sentences or image files)."""
    kind = source.kind
    if kind in ("vit", "cnn"):
        from attnlab.explore.vision import cnn_examples, vit_examples

        data = (vit_examples if kind == "vit" else cnn_examples)(source, inputs)
    else:
        from attnlab.explore.text import check_texts

        check_texts(inputs, max_chars)
        if kind == "classifier":
            from attnlab.explore.text import classifier_examples

            data = classifier_examples(source, inputs, member)
        elif kind == "bert":
            from attnlab.explore.text import bert_examples

            data = bert_examples(source, inputs)
        elif kind == "gpt":
            from attnlab.explore.lm import gpt_examples

            data = gpt_examples(source, inputs, max_new_tokens, temperature, seed)
        else:
            from attnlab.explore.seq2seq import translate_examples

            data = translate_examples(source, inputs, beam_size)
    return {"format": FORMAT_VERSION, "kind": kind, "run": source.name, **data}


def _asset(name: str) -> str:
    return resources.files("attnlab.explore").joinpath("assets", name).read_text("utf-8")


def render_page(data: dict[str, Any]) -> str:
    """The self-contained HTML page showing ``data``."""
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # Inside <script>, "</script" or "<!--" would end the element early; "<" can only occur
    # inside JSON strings, where the escape \u003c reads the same.
    blob = blob.replace("<", "\\u003c")
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;")
    parts = {
        "__TITLE__": f"attnlab explore · {title}",
        "__CSS__": _asset("explorer.css"),
        "__JS__": _asset("pieces.js") + "\n" + _asset("explorer.js"),
        "__DATA__": blob,
    }
    return re.sub("|".join(parts), lambda m: parts[m.group(0)], _asset("page.html"))


def read_page_data(html: str) -> dict[str, Any]:
    """The data embedded in a page written by :func:`render_page` (for tests and tools)."""
    start = html.index('<script type="application/json" id="attnlab-data">')
    start = html.index(">", start) + 1
    end = html.index("</script>", start)
    return json.loads(html[start:end])
