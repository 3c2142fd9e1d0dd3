"""Session fixtures of the explorer tests: tiny runs of every kind, and one browser."""

from __future__ import annotations

from pathlib import Path

import explore_runs
import pytest


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run folders (random tiny models) for every kind, plus a test image."""
    root = tmp_path_factory.mktemp("explore-runs")
    return {
        "classifier": explore_runs.classifier_run(root),
        "gpt": explore_runs.gpt_run(root),
        "translate": explore_runs.translate_run(root),
        "vit": explore_runs.vision_run(root, "vit"),
        "cnn": explore_runs.vision_run(root, "cnn", channel_attention="cbam"),
        "cnn_ca": explore_runs.vision_run(root / "ca", "cnn", channel_attention="ca"),
        "image": explore_runs.image_file(root),
    }




@pytest.fixture
def tab(browser):
    """A fresh page; fails the test on any console error or uncaught exception (the browser's
    own note on an HTTP 400 answer is expected: the live test sends bad input on purpose)."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "status of 400" not in m.text else None
        ),
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: _local_only(r.url, errors))
    yield page
    page.close()
    assert not errors, errors


def _local_only(url: str, errors: list[str]) -> None:
    if not url.startswith(("file://", "data:", "blob:", "http://127.0.0.1", "about:")):
        errors.append(f"network request to {url}")
