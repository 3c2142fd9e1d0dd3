"""The explorer page in a real browser (headless Debian chromium via Playwright).

Every page is opened from disk; the ``tab`` fixture fails a test on any console error, uncaught
exception or request that leaves the machine.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from attnlab.explore.page import explore_data, render_page
from attnlab.explore.sources import load_source

TEXTS = ["好看极了精彩感人", "剧情拖沓"]


def _write(run: Path, out: Path, inputs: list[str], **options) -> Path:
    out.write_text(render_page(explore_data(load_source(run), inputs, **options)), "utf-8")
    return out


def _open(tab, page: Path) -> None:
    tab.goto(page.resolve().as_uri())
    tab.wait_for_selector("body[data-ready='1']", timeout=20_000)


def _until(condition, seconds: float = 20.0) -> None:
    """Poll ``condition`` (the page's CSP forbids the eval behind wait_for_function)."""
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _views(tab) -> list[str]:
    return tab.eval_on_selector_all("#tabs button", "b => b.map(x => x.dataset.view)")


def _view(tab, name: str) -> None:
    tab.click(f"#tabs button[data-view='{name}']")
    assert tab.get_attribute("#view", "data-view") == name


@pytest.fixture(scope="module")
def classifier_page(runs, tmp_path_factory) -> Path:
    return _write(runs["classifier"], tmp_path_factory.mktemp("page") / "c.html", TEXTS)


def test_classifier_head_view_heads_hover_and_png(tab, classifier_page):
    _open(tab, classifier_page)
    assert _views(tab) == ["head", "matrix", "scale", "tokens"]
    assert tab.inner_text("#pred-label").split()[0] in ("positive", "negative")
    assert tab.locator("#heads button[data-head]").count() == 2  # the model's heads
    assert tab.locator("#layer option").count() == 2  # and layers
    canvas = tab.locator("#head-canvas")
    both = canvas.get_attribute("data-signature")
    assert int(canvas.get_attribute("data-queries")) == 9  # every query token has links
    tab.click("#heads button[data-head='1']")  # only head 2
    one = tab.locator("#head-canvas").get_attribute("data-signature")
    assert one != both
    tab.select_option("#layer", "1")
    assert tab.locator("#head-canvas").get_attribute("data-signature") not in (one, both)
    # hovering query token 3 (left column) leaves only its links
    box = tab.locator("#head-canvas").bounding_box()
    tab.mouse.move(box["x"] + 120, box["y"] + 8 + 3 * 18 + 9)
    canvas = tab.locator("#head-canvas")
    assert canvas.get_attribute("data-focus") == "q3"
    assert canvas.get_attribute("data-queries") == "1"
    assert 1 <= int(canvas.get_attribute("data-links")) <= 9
    tab.mouse.move(box["x"] + 5, box["y"] + box["height"] + 50)  # leave: all links again
    assert tab.locator("#head-canvas").get_attribute("data-queries") == "9"
    with tab.expect_download() as download:
        tab.click("#save-png")
    path = download.value.path()
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_classifier_warns_about_a_text_of_unseen_characters(tab, runs, tmp_path):
    _open(tab, _write(runs["classifier"], tmp_path / "u.html", ["好看极了", "鼋鼍蛟龙好"]))
    assert tab.inner_text("#pred-unknown") == "unknown tokens 0%"
    assert tab.locator("#pred-warning").count() == 0
    tab.select_option("#example", "1")
    assert tab.inner_text("#pred-warning").startswith("⚠ out of reach: 80% of its characters")


def test_classifier_matrix_slider_masks_and_tokens(tab, classifier_page):
    _open(tab, classifier_page)
    _view(tab, "matrix")
    assert tab.locator("#thumbs canvas").count() == 2 * (2 + 1)  # layers x (heads + mean)
    tab.click("#thumbs canvas[data-layer='1'][data-head='0']")
    assert tab.locator("#layer").input_value() == "1"
    _view(tab, "scale")
    summary = tab.locator("#entropy-summary")
    assert "max |Δ|" in summary.inner_text()  # at 1/√d_k the page reproduces the model
    at_model = summary.get_attribute("data-entropies")
    tab.locator("#scale-slider").fill("1000")  # s = 1: no scaling
    no_scaling = summary.get_attribute("data-entropies")
    assert no_scaling != at_model
    tab.locator("#scale-slider").fill("0")  # s = 1/d_k: flatter
    flat = [float(v) for v in summary.get_attribute("data-entropies").split(",")]
    sharp = [float(v) for v in no_scaling.split(",")]
    assert all(f >= s - 1e-9 for f, s in zip(flat, sharp))  # entropy falls as s grows
    # the second, shorter input keeps its own length: 5 tokens, no <pad> drawn
    tab.select_option("#example", "1")
    _view(tab, "matrix")
    tab.check("#mask-toggle")
    assert tab.inner_text("#mask-legend").startswith("no cell is masked in this input")
    _view(tab, "head")
    assert tab.locator("#head-canvas").get_attribute("data-queries") == "5"  # <cls> + 4
    _view(tab, "tokens")
    assert tab.locator("#tokens-canvas").count() == 1 and tab.locator("#share-bars").count() == 1


def test_gpt_steps_and_causal_mask(tab, runs, tmp_path):
    page = _write(runs["gpt"], tmp_path / "g.html", ["To be"], max_new_tokens=5)
    _open(tab, page)
    assert _views(tab) == ["steps", "head", "matrix", "scale"]
    assert tab.locator("#step-chips span").count() == 5
    tab.click("#step-chips span[data-step='3']")
    assert tab.locator("#step-canvas").get_attribute("data-step") == "3"
    at_one = tab.locator("#topk-canvas").get_attribute("data-probs")
    tab.locator("#temp-slider").fill("300")  # T = 3: flatter
    hot = tab.locator("#topk-canvas").get_attribute("data-probs")
    assert float(hot.split(",")[0]) < float(at_one.split(",")[0])
    assert "T = 3.00" in tab.inner_text("#temp-label")
    _view(tab, "matrix")
    tab.check("#mask-toggle")
    assert tab.inner_text("#mask-legend").startswith(f"masks shown: {10 * 9 // 2} cells blocked")


def test_translation_groups(tab, runs, tmp_path):
    page = _write(runs["translate"], tmp_path / "t.html", ["the cat sat"])
    _open(tab, page)
    assert _views(tab)[0] == "matrix"
    options = tab.eval_on_selector_all("#group option", "o => o.map(x => x.textContent)")
    assert options[0].startswith("cross-attention") and len(options) == 3
    assert tab.locator("#thumbs canvas").count() == 2 * (2 + 1)
    tab.select_option("#group", "1")  # encoder self-attention: source x source
    assert tab.locator("#thumbs canvas").count() == 2 * (2 + 1)
    assert tab.inner_text("#translation") is not None


def test_vision_overlays(tab, runs, tmp_path):
    page = _write(runs["vit"], tmp_path / "v.html", [str(runs["image"])])
    _open(tab, page)
    assert _views(tab) == ["image", "matrix", "head", "scale"]
    assert tab.locator("#overlays canvas[data-overlay]").count() == 2  # selection + rollout
    assert tab.locator("#view canvas[data-overlay]").count() == 2 + 2  # + one per head
    for kind, maps in (("cnn", 2), ("cnn_ca", 2)):
        page = _write(runs[kind], tmp_path / f"{kind}.html", [str(runs["image"])])
        _open(tab, page)
        assert _views(tab) == ["gates"]
        assert tab.locator("canvas.gate-map[data-overlay]").count() == maps


def test_a_1000_token_input_renders_in_seconds(tab, tmp_path_factory):
    from explore_runs import classifier_run

    run = classifier_run(tmp_path_factory.mktemp("long"), max_len=1001, n_layers=1)
    text = ("好看极了精彩感人剧情拖沓" * 100)[:1000]
    page = _write(run, tmp_path_factory.mktemp("longpage") / "long.html", [text], max_chars=1000)
    start = time.perf_counter()
    _open(tab, page)  # parse, decode, draw the head view
    _view(tab, "matrix")
    _view(tab, "scale")
    seconds = time.perf_counter() - start
    assert int(tab.locator("#head-canvas").count()) == 0  # on the scale view now
    _view(tab, "head")
    assert int(tab.locator("#head-canvas").get_attribute("data-links")) <= 3000  # the strongest
    assert seconds < 10, f"1,000 tokens took {seconds:.1f} s"


def test_live_mode_answers_a_typed_sentence(tab, runs):
    from attnlab.explore.server import make_server

    source = load_source(runs["classifier"])
    options = {"max_chars": 50, "member": 0}
    server = make_server(source, [], options, "127.0.0.1", 0)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        tab.goto(url)
        tab.wait_for_selector("body[data-ready='1']")
        tab.fill("#live-input", "演技很棒")
        tab.click("#live-go")
        _until(lambda: tab.locator("#example option").first.text_content() == "演技很棒")
        assert tab.locator("#head-canvas").get_attribute("data-queries") == "5"  # <cls> + 4
        assert tab.inner_text("#pred-label").split()[0] in ("positive", "negative")
        tab.fill("#live-input", " ")
        tab.click("#live-go")
        _until(lambda: len(tab.locator("#live-error").text_content()) > 8)
        assert "input 1 is empty" in tab.inner_text("#live-error")
        answer = tab.evaluate(
            "async () => { const r = await fetch('api/explore', {method: 'POST', body: 'nope'});"
            " return [r.status, await r.json()]; }"
        )
        assert answer[0] == 400 and "error" in answer[1]
        big = json.dumps({"inputs": ["好" * 51]})
        status = tab.evaluate(
            "async b => (await fetch('api/explore', {method: 'POST', body: b})).status", big
        )
        assert status == 400
    finally:
        server.shutdown()
        server.server_close()


def test_cli_png_of_a_chosen_view(runs, tmp_path, capsys):
    from attnlab.cli import main

    png = tmp_path / "shot.png"
    args = ["explore", str(runs["classifier"]), "好看极了", "--out", str(tmp_path / "p.html")]
    assert main([*args, "--png", str(png), "--view", "matrix"]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert main([*args, "--png", str(png), "--view", "steps"]) == 2
    assert "this page has the views head, matrix, scale, tokens" in capsys.readouterr().err


def test_live_server_takes_an_uploaded_image_and_refuses_junk(runs):
    import base64
    import urllib.request

    from attnlab.explore.server import make_server

    server = make_server(load_source(runs["vit"]), [], {"max_chars": 10}, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/explore"

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    try:
        image = base64.b64encode(runs["image"].read_bytes()).decode()
        status, data = post({"image": f"data:image/png;base64,{image}"})
        assert status == 200 and data["kind"] == "vit" and data["live"]["accepts"] == "image"
        assert data["examples"][0]["input"] == "uploaded image"
        status, data = post({"image": "data:image/png;base64,bm90IGFuIGltYWdl"})
        assert status == 400 and "cannot read as an image" in data["error"]
        status, data = post({"inputs": ["text"]})
        assert status == 400 and "send an image file" in data["error"]
    finally:
        server.shutdown()
        server.server_close()
