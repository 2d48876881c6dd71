"""The docs site renders, offline, in a real browser: build it with MkDocs (strict, as
mkdocs.yml says), serve it on loopback, load the home page in Debian's Chromium (headless,
driven by Playwright through its DevTools protocol) and check that nothing went wrong: no console
error, no failed request, no request that leaves loopback (the site must not load fonts or
scripts from the internet), the navigation and the page's heading rendered. A screenshot of the
home page is left in .cache/docs/home.png to look at."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from docs_support import REPO

CHROMIUM = "/usr/bin/chromium"  # Debian's package (make setup); Playwright downloads no browser
SCREENSHOT = REPO / ".cache" / "docs" / "home.png"
# Chromium's own switches for a test run: no sandbox (root in a container), no GPU, no
# background traffic of its own, and a fresh profile (Playwright passes one per launch).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor
        check=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """The site's files, without a log line per request in the test's output."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_home_page_renders_in_headless_chromium_with_no_console_error(served: str):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    offsite: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on(
                "console",
                lambda m: (
                    errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url} {r.failure}"))

            def loopback_only(route, request) -> None:
                if urlsplit(request.url).hostname == "127.0.0.1":
                    route.continue_()
                else:
                    offsite.append(request.url)
                    route.abort()

            page.route("**/*", loopback_only)
            response = page.goto(served + "/", wait_until="networkidle")
            assert response is not None and response.status == 200
            heading = page.locator("article h1").first.inner_text()
            nav = page.locator("nav.md-nav--primary").first.inner_text()
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            shot = SCREENSHOT.with_suffix(".tmp.png")
            page.screenshot(path=str(shot), full_page=False)
            shutil.move(shot, SCREENSHOT)
        finally:
            browser.close()
    assert not offsite, f"the site reaches beyond loopback: {offsite}"
    assert not errors, "\n".join(errors)
    assert heading.rstrip("¶ \n") == "torchfleet"  # ¶: the heading's permalink
    for entry in ("Quick start", "Deploy", "Configuration", "Contracts", "Development"):
        assert entry in nav, f"{entry!r} missing from the navigation: {nav!r}"
    assert SCREENSHOT.stat().st_size > 10_000  # a rendered page, not a blank one
