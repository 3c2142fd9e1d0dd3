"""Screenshots of `attnlab serve`'s page at / for a run, as it opens (the tutorial's turned
sentence classified and explained), in Chinese and in English.

    python -m benchmarks.explore.serve_page --run /work/runs/before_s0
    # -> docs/img/serve_page_zh.png, docs/img/serve_page_en.png
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path

import attnlab
from attnlab.serve.app import App, make_handler
from attnlab.serve.http import Server, listen

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="/work/runs/before_s0")
    parser.add_argument("--out", default=str(ROOT / "docs" / "img" / "serve_page"))
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    app = App(attnlab.load(args.run))
    server = listen(Server, make_handler(app, "127.0.0.1", 1 << 20), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    written = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        args=["--no-sandbox"])  # fmt: skip
            for lang in ("zh", "en"):
                tab = browser.new_page(viewport={"width": 1000, "height": 760},
                                       locale="zh-CN" if lang == "zh" else "en-US")  # fmt: skip
                tab.goto(url)
                end = time.monotonic() + 300
                while tab.get_attribute("body", "data-answered") != "1":
                    if time.monotonic() > end:
                        raise SystemExit("the page got no answer in 300 s")
                    time.sleep(0.1)
                path = f"{args.out}_{lang}.png"
                tab.screenshot(path=path, full_page=True)
                written.append(path)
                tab.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
        app.batcher.close()
    print("written " + ", ".join(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
