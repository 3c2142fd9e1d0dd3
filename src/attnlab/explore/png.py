"""`--png`: a screenshot of one view of an explorer page, taken by headless chromium.

Playwright drives Debian's ``chromium`` (its own browser download is never used); when either
is missing the error says how to install it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from attnlab.errors import UserError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    """The path of an installed chromium, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(
    page: str | Path, out: str | Path, view: str | None = None, width: int = 1200
) -> Path:
    """Open ``page`` from disk, switch to ``view`` (default: the page's first), save ``out``."""
    browser_path = find_browser()
    if browser_path is None:
        raise UserError(
            "--png needs chromium: install it with `apt-get install chromium` "
            "(bash scripts/setup.sh --test does)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError(
            "--png needs the playwright package: pip install 'attnlab[test]' "
            "(bash scripts/setup.sh --test)"
        ) from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # In a thread of its own: Playwright's sync API refuses a thread that already runs an
    # event loop (a notebook, or a test session holding a browser).
    errors: list[BaseException] = []

    def shoot() -> None:
        try:
            _shoot(sync_playwright, browser_path, Path(page), out, view, width)
        except BaseException as err:  # handed to the caller's thread
            errors.append(err)

    worker = threading.Thread(target=shoot)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return out


def _shoot(
    sync_playwright, browser_path: str, page: Path, out: Path, view: str | None, width: int
) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": width, "height": 900})
            tab.goto(page.resolve().as_uri())
            tab.wait_for_selector("body[data-ready='1']", timeout=30_000)
            if view is not None:
                views = tab.eval_on_selector_all("#tabs button", "b => b.map(x => x.dataset.view)")
                if view not in views:
                    raise UserError(f"--view {view}: this page has the views {', '.join(views)}")
                tab.evaluate("v => window.attnlab.setView(v)", view)
            tab.locator("body").screenshot(path=str(out))
        finally:
            browser.close()
