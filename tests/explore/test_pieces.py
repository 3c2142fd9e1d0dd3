"""The explorer on a fine-tuned pretrained encoder: which of the text's pieces moved the decision
(integrated gradients) in the page data and in the browser, the model named from what the run
records, e5's "query: " prefix explained and kept apart, the live page's first sentence."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import torch

from attnlab.data.sentiment import TUTORIAL_EXAMPLES
from attnlab.explore.page import explore_data, read_page_data, render_page
from attnlab.explore.sources import load_source
from attnlab.infer.attribution import attribute, text_pieces

sys.path.insert(0, str(Path(__file__).parents[1]))
import _runs  # noqa: E402

TURNED = TUTORIAL_EXAMPLES[2][0]  # 电影前半段很无聊，但是结局让我感动
HOSTILE = '好<img src=x onerror="document.body.dataset.owned=1">看</script><script>x=1</script>'
E5_MODEL = "intfloat/multilingual-e5-small (MIT), Wang et al. 2024, arXiv:2402.05672"


@pytest.fixture(scope="module")
def e5_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny e5-layout run whose data report records its encoder as a trained run does."""
    run = _runs.e5_run(tmp_path_factory.mktemp("pieces") / "e5")
    report = json.loads((run / "data_report.json").read_text(encoding="utf-8"))
    report["encoder"] = {"name": "e5", "family": "bert", "embedding_size": 0, "model": E5_MODEL}
    (run / "data_report.json").write_text(json.dumps(report), encoding="utf-8")
    return run


@pytest.fixture(scope="module")
def e5_page(e5_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = explore_data(load_source(e5_run), [TURNED, HOSTILE])
    out = tmp_path_factory.mktemp("pieces-page") / "e5.html"
    out.write_text(render_page(data), encoding="utf-8")
    return out


def test_page_data_holds_the_attribution_of_the_text_pieces(e5_run, e5_page):
    data = read_page_data(e5_page.read_text(encoding="utf-8"))
    assert data["title"].startswith("multilingual-e5-small, fine-tuned (run e5) ·")
    assert '"query: "' in data["subtitle"] and "BERT" not in data["title"]
    run = load_source(e5_run).run
    for ex, text in zip(data["examples"], [TURNED, HOSTILE]):
        a = ex["attribution"]
        assert a["label"] == ex["prediction"]["label"]
        tokens = run.tokenizer.tokens(text, run.max_len)
        start, stop = text_pieces(run.tokenizer, text, len(tokens))
        assert a["tokens"] == tokens
        assert a["roles"] == ["special"] + ["prefix"] * 3 + ["text"] * (stop - start) + ["special"]
        ids = torch.tensor([run.tokenizer.encode(text, run.max_len)])
        want = attribute(run.model, ids, (start, stop))
        assert a["scores"] == pytest.approx(want["scores"].tolist(), abs=1e-6)
        probs = ex["prediction"]["probs"]
        p = probs[a["label"]]
        assert a["log_odds"] == pytest.approx(float(torch.tensor(p / (1 - p)).log()), abs=1e-4)
        assert sum(a["scores"]) == pytest.approx(a["log_odds"] - a["reference_log_odds"], abs=1e-3)


def test_an_encoder_without_a_recorded_name_is_named_by_its_arch(tmp_path):
    from explore_runs import bert_classifier_run

    data = explore_data(load_source(bert_classifier_run(tmp_path)), ["a fine film"])
    assert data["title"].startswith("minilm, fine-tuned (run bert_classify)")
    assert "subtitle" not in data  # no prompt prefix to explain
    a = data["examples"][0]["attribution"]
    assert a["roles"][0] == a["roles"][-1] == "special" and "prefix" not in a["roles"]


def test_the_live_page_opens_on_the_tutorials_turned_sentence(e5_run):
    from attnlab.explore.server import make_server

    server = make_server(load_source(e5_run), [], {"max_chars": 100}, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with urllib.request.urlopen(url, timeout=30) as answer:
            data = read_page_data(answer.read().decode("utf-8"))
    finally:
        server.shutdown()
        server.server_close()
    assert [ex["input"] for ex in data["examples"]] == [TURNED]
    assert "attribution" in data["examples"][0]


def test_pieces_view_in_the_browser(tab, e5_page):
    tab.goto(e5_page.resolve().as_uri())
    tab.wait_for_selector("body[data-ready='1']", timeout=20_000)
    views = tab.eval_on_selector_all("#tabs button", "b => b.map(x => x.dataset.view)")
    assert views[0] == "pieces" and tab.get_attribute("#view", "data-view") == "pieces"
    data = read_page_data(e5_page.read_text(encoding="utf-8"))
    a = data["examples"][0]["attribution"]
    text = [t for t, r in zip(a["tokens"], a["roles"]) if r == "text"]
    assert tab.eval_on_selector_all("#pieces .piece", "c => c.map(x => x.textContent)") == text
    apart = tab.eval_on_selector_all("#pieces-apart .piece", "c => c.map(x => x.textContent)")
    assert apart == ["<s>", "▁que", "ry", ":", "</s>"]
    rows = tab.locator("#pieces-table tr").count()
    assert rows == 1 + min(10, len(text))
    assert "query: " in tab.inner_text("#subtitle")
    assert tab.locator("#layer").count() == 0 and tab.locator("#heads").count() == 0
    tab.click("#tabs button[data-view='head']")  # a view of one layer's heads has them
    assert tab.locator("#layer").count() == 1 and tab.locator("#heads").count() == 1
    tab.click("#tabs button[data-view='pieces']")
    tab.select_option("#example", "1")  # the hostile text: shown as text, never run
    shown = "".join(tab.eval_on_selector_all("#pieces .piece", "c => c.map(x => x.textContent)"))
    assert "img" in shown and "script" in shown
    assert tab.locator("#view img").count() == 0 and tab.locator("#view script").count() == 0
    assert tab.evaluate("() => document.body.dataset.owned") is None
