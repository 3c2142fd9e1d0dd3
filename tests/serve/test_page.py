"""``attnlab serve``'s page at ``/`` and its ``POST /explain``: the numbers equal the Python
API's and the explorer's attribution, bad bodies get one line, and in headless Chromium the page
classifies, shows which pieces moved the decision, switches language, loads nothing from
elsewhere and shows a hostile text as text."""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import attnlab
from attnlab.data.sentiment import TUTORIAL_EXAMPLES
from attnlab.infer.attribution import piece_attribution
from attnlab.serve.app import App, make_handler
from attnlab.serve.http import Server, listen

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
import _runs  # noqa: E402

TURNED = TUTORIAL_EXAMPLES[2][0]
HOSTILE = '好<img src=x onerror="document.body.dataset.owned=1">看</script><script>x=1</script>'


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return _runs.e5_run(tmp_path_factory.mktemp("page") / "run", "mean", max_len=48)


def _serve(run: Path):
    app = App(attnlab.load(run), max_texts=8)
    srv = listen(Server, make_handler(app, "127.0.0.1", 1 << 20), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, app


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    """Labels that are markup: the page must show them as text."""
    run = _runs.e5_run(tmp_path_factory.mktemp("page") / "hostile", "mean", max_len=48)
    path = run / "labels.json"
    vocab = json.loads(path.read_text(encoding="utf-8"))
    vocab["labels"] = ["<b>good</b>", '<img src=x onerror="document.body.dataset.owned=1">']
    path.write_text(json.dumps(vocab), encoding="utf-8")
    return run


@contextlib.contextmanager
def serving(run: Path) -> Iterator[int]:
    """The run behind the page's server on a free loopback port, closed after."""
    srv, app = _serve(run)
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        app.batcher.close()


@pytest.fixture
def server(run):
    with serving(run) as port:
        yield port


def request(port: int, method: str, path: str, body: object = None, kind="application/json"):
    """(status, headers, body bytes) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
    conn.request(method, path, data, {"Content-Type": kind} if data is not None else {})
    answer = conn.getresponse()
    out = answer.status, dict(answer.getheaders()), answer.read()
    conn.close()
    return out


def test_the_page_is_one_offline_file(server):
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    html = body.decode("utf-8")
    assert "<script src" not in html and "<link" not in html and "://" not in html
    assert TURNED in html  # the first text it classifies
    status, _, body = request(server, "HEAD", "/")
    assert status == 200 and body == b""


def test_explain_equals_the_api_and_the_explorer(server, run):
    status, _, body = request(server, "POST", "/explain", {"text": TURNED})
    assert status == 200
    out = json.loads(body)
    loaded = attnlab.load(run)
    (want,) = loaded.predict([TURNED])
    assert out["prediction"]["label"] == want["label"]
    assert out["prediction"]["probs"] == pytest.approx(want["probs"], abs=1e-6)
    a = out["attribution"]
    ref = piece_attribution(loaded.run, TURNED)
    assert a["tokens"] == ref["tokens"] and a["roles"] == ref["roles"]
    assert a["scores"] == pytest.approx(ref["scores"], abs=1e-6)
    assert a["roles"][1:4] == ["prefix"] * 3  # "query:" apart from the text's pieces


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"texts": ["a"]}, 400, '{"text": "..."}'),
        ({"text": "  "}, 400, "non-empty"),
        ({"text": 5}, 400, "non-empty string"),
        ({"text": "好" * 2001}, 413, "at most 2000"),
        (["a"], 400, '{"text": "..."}'),
    ],
)
def test_explain_refuses_bad_bodies_in_one_line(server, body, status, says):
    got, _, raw = request(server, "POST", "/explain", body)
    error = json.loads(raw)["error"]
    assert got == status and says in error and "\n" not in error
    got, _, raw = request(server, "POST", "/explain", {"text": "a"}, kind="text/plain")
    assert got == 415
    got, _, _ = request(server, "GET", "/explain")
    assert got == 405


def test_a_character_run_gets_the_label_without_attribution(tmp_path):
    import explore_runs

    srv, app = _serve(explore_runs.classifier_run(tmp_path))
    try:
        status, _, body = request(srv.server_address[1], "POST", "/explain", {"text": "好看"})
    finally:
        srv.shutdown()
        srv.server_close()
        app.batcher.close()
    out = json.loads(body)
    assert status == 200 and out["attribution"] is None
    assert out["prediction"]["label"] in ("positive", "negative")




def _until(condition, seconds: float = 60.0) -> None:
    """Poll ``condition`` (the page's CSP forbids the eval behind wait_for_function)."""
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.fixture
def hostile_server(hostile_run):
    with serving(hostile_run) as port:
        yield port


def test_the_page_in_chromium(browser, hostile_server, hostile_run):
    server, run = hostile_server, hostile_run
    tab = browser.new_page(viewport={"width": 1100, "height": 900}, locale="zh-CN")
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on(
        "request", lambda r: None if r.url.startswith("http://127.0.0.1") else errors.append(r.url)
    )
    try:
        tab.goto(f"http://127.0.0.1:{server}/")
        tab.wait_for_selector("body[data-ready='1']")
        _until(lambda: tab.get_attribute("body", "data-answered") == "1")  # the first text
        (want,) = attnlab.load(run).predict([TURNED])
        assert tab.inner_text("#label").rsplit(None, 1)[0] == want["label"]
        assert want["label"] in tab.inner_text("#probs") and "<b>good</b>" in tab.inner_text(
            "#subtitle"
        )
        assert tab.inner_text("#title") == "试用分类器 · e5（微调）"  # the run's arch: no report
        assert "query: " in tab.inner_text("#prefix-note")
        pieces = tab.eval_on_selector_all("#pieces .piece", "c => c.map(x => x.textContent)")
        assert "".join(pieces).replace("▁", "") == TURNED.replace("，", ",")
        apart = tab.eval_on_selector_all("#pieces-apart .piece", "c => c.map(x => x.textContent)")
        assert apart == ["<s>", "▁que", "ry", ":", "</s>"]
        tab.click("#lang-en")
        assert tab.inner_text("#title").startswith("Try the classifier")
        assert tab.inner_text("#pieces-title") == "Which pieces moved the decision"
        tab.fill("#text", HOSTILE)
        tab.click("#go")
        _until(lambda: tab.get_attribute("body", "data-answered") == "2")
        shown = "".join(
            tab.eval_on_selector_all("#pieces .piece", "c => c.map(x => x.textContent)")
        )
        assert "img" in shown and "script" in shown
        assert tab.locator("img, b, main script").count() == 0
        assert tab.evaluate("() => document.body.dataset.owned") is None
        tab.fill("#text", " ")
        tab.click("#go")
        _until(lambda: "non-empty" in tab.inner_text("#error"))
    finally:
        tab.close()
    assert all("status of 400" in e for e in errors), errors
