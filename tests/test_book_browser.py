"""The built book in a real browser: every page at 1280x900, a common laptop window.

Opens _build/html (`make book` builds it from the stored outputs) in headless
Chromium, driven by Playwright through the browser installed on this machine
(`executable_path`: nothing is downloaded at run time). On every page: no code or
output block, table or other box of the theme scrolls sideways, and neither does the
page; no image is broken, nothing is logged as an error; and every chapter shows
per-rank output in columns (`%%ranks`).

Chromium comes from the system: `apt-get install chromium` (Debian/Ubuntu, as root),
or DISTCOURSE_CHROMIUM=/path/to/chrome for a browser installed elsewhere.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
WIDTH, HEIGHT = 1280, 900
# Blocks that must wrap, not scroll: code, outputs, tables, %%ranks grids, and the
# boxes pydata-sphinx-theme scrolls sideways when their content is too wide: the
# wrapper of every table (a wide table stays its own width inside it, so only the
# wrapper shows it), display math, the article itself. Any other element of the
# article whose computed overflow-x is auto or scroll is checked too (SIDEWAYS), and
# so is the page as a whole.
BLOCKS = (
    "pre, div.highlight, div.cell_output, div.output, table, div.dc-ranks, "
    "div.pst-scrollable-table-container, div.math mjx-container, "
    "div.bd-article-container"
)
INSTALL = (
    "Chromium is needed for the browser test: `apt-get install chromium` (as root), "
    "or set DISTCOURSE_CHROMIUM=/path/to/chromium"
)

# JavaScript run in each page: the blocks wider than their box (the innermost of
# nested ones), and broken images.
SIDEWAYS = """(sel) => {
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const boxes = new Set([...document.querySelectorAll(sel),
    ...[...document.querySelectorAll('.bd-article-container *')].filter(scrolls)]);
  const wide = [...boxes].filter(e => e.scrollWidth > e.clientWidth + 1);
  const page = document.documentElement;
  return wide.filter(e => !wide.some(o => o !== e && e.contains(o)))  // innermost
    .map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')} `
              + `(${e.scrollWidth} > ${e.clientWidth} px): `
              + e.innerText.trim().split('\\n')[0].slice(0, 70))
    .concat(page.scrollWidth > page.clientWidth + 1
      ? [`the page (${page.scrollWidth} > ${page.clientWidth} px)`] : []);
}"""
BROKEN = """() => [...document.images]
  .filter(i => i.complete && i.naturalWidth === 0).map(i => i.src)"""


def chromium() -> str:
    """The browser to drive: DISTCOURSE_CHROMIUM, else chromium on the PATH."""
    path = os.environ.get("DISTCOURSE_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None
    )
    if not path or not Path(path).exists():
        pytest.fail(INSTALL, pytrace=False)
    return path


def pages() -> list[Path]:
    """Every page of the built book, less redirects (index.html) and _static."""
    found = sorted(HTML.rglob("*.html"))
    return [
        p
        for p in found
        if not p.relative_to(HTML).parts[0].startswith("_")
        and 'http-equiv="Refresh"' not in p.read_text()[:1000]
    ]


def chapters() -> list[str]:
    """Chapter pages: book/NN_*.ipynb, each built to book/NN_*.html."""
    return sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]*_*.ipynb"))


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves files without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The built book served on a loopback port, as a reader's browser gets it."""
    if not (HTML / "index.html").exists():
        pytest.fail("the book is not built: run `make book`", pytrace=False)
    handler = functools.partial(Quiet, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    path = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=path, headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


def visit(browser: object, url: str) -> dict[str, list[str]]:
    """Open `url` at WIDTH x HEIGHT; what scrolls sideways, broken images, errors."""
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})  # type: ignore[attr-defined]
    errors: list[str] = []

    def console(message: object) -> None:
        where = message.location.get("url", "")  # type: ignore[attr-defined]
        # the browser asks the server root for /favicon.ico; the book has none
        if message.type == "error" and not where.endswith("/favicon.ico"):  # type: ignore[attr-defined]
            errors.append(f"{message.text} ({where})")  # type: ignore[attr-defined]

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url, wait_until="load")
        page.wait_for_load_state("networkidle")
        return {
            "sideways": page.evaluate(SIDEWAYS, BLOCKS),
            "broken": page.evaluate(BROKEN),
            "errors": errors,
            "ranks": page.evaluate("document.querySelectorAll('.dc-ranks').length"),
        }
    finally:
        page.close()


@functools.cache
def _report(browser: object, url: str) -> dict:
    return visit(browser, url)


def _url(site: str, path: Path) -> str:
    return f"{site}/{path.relative_to(HTML).as_posix()}"


def test_the_book_is_built_and_has_every_chapter(site: str) -> None:
    built = {p.stem for p in pages()}
    assert set(chapters()) <= built, f"missing pages: {set(chapters()) - built}"


@pytest.mark.parametrize("kind", ["sideways", "broken", "errors"])
def test_every_page_fits_a_1280px_window(browser: object, site: str, kind: str) -> None:
    """No sideways-scrolling block, no broken image, no console error, on any page."""
    found = {
        str(p.relative_to(HTML)): _report(browser, _url(site, p))[kind] for p in pages()
    }
    bad = {page: items for page, items in found.items() if items}
    assert not bad, f"{kind} at {WIDTH}x{HEIGHT}:\n" + "\n".join(
        f"{page}: {item}" for page, items in bad.items() for item in items
    )


# Per-rank columns: fails for a chapter until its %%px cells that print are %%ranks.
@pytest.mark.parametrize("chapter", chapters())
def test_chapter_shows_per_rank_output_in_columns(
    browser: object, site: str, chapter: str
) -> None:
    report = _report(browser, f"{site}/book/{chapter}.html")
    assert report["ranks"] > 0, f"{chapter}: no %%ranks output (div.dc-ranks)"
