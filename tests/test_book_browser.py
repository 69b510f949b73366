"""The built book in a real browser: every page at 1280x900, a common laptop window.

Opens _build/html (`make book` builds it from the stored outputs) in headless
Chromium, driven by Playwright through the browser installed on this machine
(`executable_path`: nothing is downloaded at run time). On every page: no code or
output block, table or other box of the theme scrolls sideways, and neither does the
page; no image is broken, nothing is logged as an error; and every chapter shows
per-rank output in columns (`%%ranks`). Every link of every page resolves.

The book's reading rules (issue 53) hold for the chapters in READ: tables as
tables (no line of a table wraps, no word of a per-rank column is broken), every
figure numbered, captioned, described and its text at least as large as the body's
smallest at the size shown, formulas typeset, paragraphs of at most 120 words, a
takeaways box, pitfalls as callouts; and those pages, the introduction and the
appendices read on a 390-px phone with nothing scrolling sideways outside code.
A chapter joins READ when it is converted.

Chromium comes from the system: `apt-get install chromium` (Debian/Ubuntu, as root),
or DISTCOURSE_CHROMIUM=/path/to/chrome for a browser installed elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from html import unescape
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
# DISTCOURSE_BOOK_HTML: a book built elsewhere (jupyter-book --path-output DIR
# writes DIR/_build/html), so that a check does not race another build
HTML = Path(os.environ.get("DISTCOURSE_BOOK_HTML", ROOT / "_build" / "html"))
WIDTH, HEIGHT = 1280, 900
# Blocks that must wrap, not scroll: code, outputs, tables, %%ranks grids, and the
# boxes pydata-sphinx-theme scrolls sideways when their content is too wide: the
# wrapper of every table (a wide table stays its own width inside it, so only the
# wrapper shows it), display math (MathML, _ext/mathml.py), the article itself.
# Any other element of the article whose computed overflow-x is auto or scroll is
# checked too (SIDEWAYS), and so is the page as a whole.
BLOCKS = (
    "pre, div.highlight, div.cell_output, div.output, table, div.dc-ranks, "
    "div.pst-scrollable-table-container, div.math, "
    "div.bd-article-container"
)
INSTALL = (
    "Chromium is needed for the browser test: `apt-get install chromium` (as root), "
    "or set DISTCOURSE_CHROMIUM=/path/to/chromium"
)

# JavaScript run in each page: the blocks wider than their box (the innermost of
# nested ones), and broken images. A wide output (.dc-wide: a figure, table or
# per-rank grid given the page's full width) may reach past the column: it is
# checked alone (its content fits it, it ends inside the window), then hidden
# while the rest is measured. `free` names blocks that may scroll (code, on a
# phone).
SIDEWAYS = """([sel, free]) => {
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const name = e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')} `
    + `(${e.scrollWidth} > ${e.clientWidth} px): `
    + e.innerText.trim().split('\\n')[0].slice(0, 70);
  const page = document.documentElement;
  const wides = [...document.querySelectorAll('.bd-article .dc-wide')];
  const found = wides.filter(w => w.scrollWidth > w.clientWidth + 1
      || w.getBoundingClientRect().right > page.clientWidth)
    .map(w => 'wide ' + name(w));
  wides.forEach(w => {
    w.dataset.display = w.style.display;
    w.style.display = 'none';
  });
  const exempt = e => free && e.closest(free);
  const boxes = new Set([...document.querySelectorAll(sel),
    ...[...document.querySelectorAll('.bd-article-container *')].filter(scrolls)]);
  const wide = [...boxes].filter(e => !exempt(e) && e.scrollWidth > e.clientWidth + 1);
  const innermost = wide.filter(e => !wide.some(o => o !== e && e.contains(o)));
  found.push(...innermost.map(name));
  if (page.scrollWidth > page.clientWidth + 1)
    found.push(`the page (${page.scrollWidth} > ${page.clientWidth} px)`);
  wides.forEach(w => { w.style.display = w.dataset.display; });
  return found;
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


# How long a page may take to load and fall quiet. Playwright's default, 30 s, was
# once too short: in a fresh-clone `make test`, where the notebooks run beside this
# check on 2 cores, chapter 12b's page loaded but its network was not yet quiet
# after 30 s. A bound against a hang, not a claim about speed.
LOAD_MS = 120_000


@contextlib.contextmanager
def opened(
    browser: object,
    url: str,
    size: tuple[int, int] = (WIDTH, HEIGHT),
    watch: Callable[[object], None] | None = None,
) -> Iterator[object]:
    """A page of `size` (width, height) at `url`, loaded and its network quiet;
    `watch(page)` runs before it loads (to listen to its console)."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})  # type: ignore[attr-defined]
    try:
        if watch:
            watch(page)
        page.goto(url, wait_until="load", timeout=LOAD_MS)
        page.wait_for_load_state("networkidle", timeout=LOAD_MS)
        yield page
    finally:
        page.close()


def visit(browser: object, url: str) -> dict[str, list[str]]:
    """Open `url` at WIDTH x HEIGHT; what scrolls sideways, broken images, errors."""
    errors: list[str] = []

    def console(message: object) -> None:
        where = message.location.get("url", "")  # type: ignore[attr-defined]
        # the browser asks the server root for /favicon.ico; the book has none
        if message.type == "error" and not where.endswith("/favicon.ico"):  # type: ignore[attr-defined]
            errors.append(f"{message.text} ({where})")  # type: ignore[attr-defined]

    def watch(page: object) -> None:
        page.on("console", console)  # type: ignore[attr-defined]
        page.on("pageerror", lambda e: errors.append(str(e)))  # type: ignore[attr-defined]

    with opened(browser, url, watch=watch) as page:
        return {
            "sideways": page.evaluate(SIDEWAYS, [BLOCKS, None]),  # type: ignore[attr-defined]
            "broken": page.evaluate(BROKEN),  # type: ignore[attr-defined]
            "errors": errors,
            "ranks": page.evaluate("document.querySelectorAll('.dc-ranks').length"),  # type: ignore[attr-defined]
        }


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


# ---------------------------------------------------------------- every link ----


def hrefs(page: Path) -> list[str]:
    """Every href of a page, as written (fragments and queries kept)."""
    return re.findall(r'<a\s[^>]*?href="([^"]*)"', page.read_text())


def ids(page: Path) -> set[str]:
    text = page.read_text()
    return set(re.findall(r'\sid="([^"]+)"', text)) | set(
        re.findall(r'\sname="([^"]+)"', text)
    )


def link_problem(page: Path, href: str, files: set[str]) -> str | None:
    """Why `href` on `page` goes nowhere, or None. A link inside the book must reach
    a built file (and its anchor); a link out must name a host as written: lower
    case, with a dot, and not a file of this repository (MyST's fuzzy links made
    "ARCHITECTURE.md" a link to http://ARCHITECTURE.md/)."""
    parts = urlsplit(unescape(href))
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        written = parts.netloc.split("@")[-1].split(":")[0]
        if not host or "." not in host or written != written.lower():
            return f"{href}: not a web address"
        if written in files:
            return f"{href}: a file of this repository, linked as a web host"
        return None
    if parts.scheme:
        return None if parts.scheme == "mailto" else f"{href}: scheme {parts.scheme}"
    target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return f"{href}: no such file ({target.name})"
    if parts.fragment and target.suffix == ".html":
        if unquote(parts.fragment) not in ids(target):
            return f"{href}: no #{parts.fragment} in {target.name}"
    return None


def test_every_link_of_every_page_goes_somewhere(site: str) -> None:
    files = {p.name for p in ROOT.iterdir()} | {
        p.name for p in (ROOT / "book").iterdir()
    }
    bad = [
        f"{page.relative_to(HTML)}: {problem}"
        for page in pages()
        for href in sorted(set(hrefs(page)))
        if (problem := link_problem(page, href, files))
    ]
    assert not bad, "links that go nowhere:\n" + "\n".join(bad)


def test_the_link_check_finds_what_it_must() -> None:
    page = HTML / "book" / "intro.html"
    if not page.exists():
        pytest.fail("the book is not built: run `make book`", pytrace=False)
    files = {"ARCHITECTURE.md"}
    assert link_problem(page, "http://ARCHITECTURE.md", files)
    assert link_problem(page, "http://localhost/", files)  # no dot: no web host
    assert link_problem(page, "01_quickstart.html#no-such-place", files)
    assert link_problem(page, "no_such_page.html", files)
    assert link_problem(page, "https://docs.pytorch.org/docs/stable/", files) is None
    assert link_problem(page, "01_quickstart.html", files) is None


# ----------------------------------------------------- the reading (issue 53) ----
# Chapters that meet the book's reading rules; the others join as they are
# converted (/work/notes of issue 53: the list of what each still needs).
READ = [
    "01_quickstart",
    "02_collectives",
    "03_data_parallel",
    "03b_ddp_in_practice",
    "04_tensor_parallel",
    "05_pipeline",
    "06_global_tensor",
    "07_global_backward",
    "08_hybrid",
    "08b_hybrid_global",
    "09_zero_fsdp",
    "10_planner",
    "11_debugging",
    "12_experts",
    "12b_context",
    "13_trainer",
]
# Pages read on a phone: those chapters, the introduction, the appendices and the
# planner page.
PHONE = ["intro", "appendix_checks", "appendix_solutions", "10b_planner_page", *READ]
PHONE_WIDTH, PHONE_HEIGHT = 390, 844
MAX_WORDS = 120  # words in one paragraph or list item

# What a page's reading is measured by (a function of MAX_WORDS): its figures,
# tables, words, formulas, paragraphs and boxes.
READING = (ROOT / "tests" / "book_reading.js").read_text()


@functools.cache
def _reading(browser: object, url: str) -> dict:
    with opened(browser, url) as page:
        return page.evaluate(READING, MAX_WORDS)  # type: ignore[attr-defined]


def chapter_number(chapter: str) -> str:
    """'12b' for 12b_context, '3' for 03_data_parallel, '' for intro."""
    head = chapter.split("_")[0]
    return head.lstrip("0") if head[:1].isdigit() else ""


# What a reading lists under each of these keys breaks a rule: a chapter in READ
# shows none of it (read_chapter checks the keys a test names).
BROKEN_RULES = {
    "tables": "table lines wrapped",
    "broken": "words broken across lines",
    "plain": "formulas as plain text",
    "long": f"paragraphs over {MAX_WORDS} words",
}


def read_chapter(browser: object, site: str, chapter: str, *clean: str) -> dict:
    """The reading of `chapter`'s page, after checking that it found nothing under
    each key of `clean` (or saying what it found, in BROKEN_RULES' words)."""
    got = _reading(browser, f"{site}/book/{chapter}.html")
    for key in clean:
        found = "\n".join(map(str, got[key]))
        assert not got[key], f"{chapter}: {BROKEN_RULES[key]}:\n{found}"
    return got


def test_the_reading_list_names_chapters_that_exist() -> None:
    assert set(READ) <= set(chapters()), set(READ) - set(chapters())


@pytest.mark.parametrize("chapter", READ)
def test_no_line_of_a_table_wraps_and_no_word_of_a_column_breaks(
    browser: object, site: str, chapter: str
) -> None:
    read_chapter(browser, site, chapter, "tables", "broken")


@pytest.mark.parametrize("chapter", ["intro", *READ])
def test_every_figure_is_numbered_captioned_described_and_readable(
    browser: object, site: str, chapter: str
) -> None:
    got = read_chapter(browser, site, chapter)
    figures, number = got["figures"], chapter_number(chapter)
    assert figures, f"{chapter}: no figure"
    prefix = f"{number}." if number else ""
    for k, f in enumerate(figures, start=1):
        want = f"Figure {prefix}{k}."
        assert f["caption"].startswith(want), f"{chapter}: figure {k} is not {want!r}"
        assert len(f["caption"]) > len(want) + 20, f"{chapter}: {want} has no caption"
        assert len(f["alt"]) > 20, f"{chapter}: {want} has no alt text"
        assert f["shown"] is not None, f"{chapter}: {want} was not made by viz.figure"
        assert f["shown"] >= got["bodySmallest"] - 0.25, (
            f"{chapter}: {want}'s smallest text shows {f['shown']:.1f} px, below "
            f"the body's smallest {got['bodySmallest']} px"
        )


@pytest.mark.parametrize("chapter", READ)
def test_formulas_are_typeset_paragraphs_short_and_the_chapter_closes(
    browser: object, site: str, chapter: str
) -> None:
    got = read_chapter(browser, site, chapter, "plain", "long")
    assert len(got["takeaways"]) == 1, f"{chapter}: one takeaways box, not {got}"
    assert got["takeaways"][0] >= 3, f"{chapter}: takeaways of at least 3 points"
    if got["pitfallSection"]:
        assert got["pitfallBoxes"], f"{chapter}: its pitfalls are not callouts"


def test_the_reading_checks_catch_what_they_must(browser: object, site: str) -> None:
    """Each check of READING fails on a page made to fail it."""
    with opened(browser, f"{site}/book/intro.html") as page:
        page.evaluate(  # type: ignore[attr-defined]
            """() => {
          const a = document.querySelector('.bd-article');
          a.insertAdjacentHTML('beforeend', `
            <p>the bubble is (p \u2212 1) / (m + p \u2212 1) of the step</p>
            <p>${'word '.repeat(130)}</p>
            <div class="dc-ranks">
              <table style="width:100px;table-layout:fixed !important"><tr><td>
              <div class="dc-rank-text" style="overflow-wrap:anywhere !important"
              >parallel.hybrid.stages.and.more</div></td></tr></table></div>
            <div class="cell_output"><pre style="width:200px;white-space:pre-wrap">` +
            'a  bb  ccc  dddddddd  eeeeeeeee  fffffff\\n'.repeat(3) + `</pre></div>
            <figure><img alt="" width="100" src="data:,"></figure>`);
        }"""
        )
        got = page.evaluate(READING, MAX_WORDS)  # type: ignore[attr-defined]
    assert any("(p" in p for p in got["plain"])
    assert any(line.startswith("130 words") for line in got["long"])
    assert got["broken"] == ["parallel.hybrid.stages.and.more"]
    assert any(t.startswith("text table: a  bb") for t in got["tables"])
    assert got["figures"][-1] == {"caption": "", "alt": "", "shown": None}


def test_the_figure_helper_sizes_hold_in_the_browser(
    browser: object, site: str
) -> None:
    """viz.figure refuses figures by the column's width, the wide width and the
    body's smallest text at 1280 px: measured here on a chapter page."""
    from distcourse.viz import numbered

    with opened(browser, f"{site}/book/12b_context.html") as page:
        got = page.evaluate(  # type: ignore[attr-defined]
            """() => {
          const out = document.querySelector('.bd-article div.cell_output .output');
          out.insertAdjacentHTML('beforeend',
            '<figure class="dc-figure dc-wide" id="probe"><div></div></figure>');
          const probe = document.getElementById('probe');
          return {column: out.clientWidth, wide: probe.clientWidth,
                  smallest: parseFloat(getComputedStyle(
                    document.querySelector('.dc-rank-text')).fontSize)};
        }"""
        )
    assert abs(got["column"] - numbered.COLUMN_PX) <= 2, got
    assert abs(got["wide"] - numbered.WIDE_PX) <= 2, got
    assert got["smallest"] == numbered.MIN_TEXT_PX, got


@pytest.mark.parametrize("name", PHONE)
def test_a_phone_scrolls_nothing_sideways_but_code(
    browser: object, site: str, name: str
) -> None:
    url, phone = f"{site}/book/{name}.html", (PHONE_WIDTH, PHONE_HEIGHT)
    with opened(browser, url, phone) as page:
        found = page.evaluate(SIDEWAYS, [BLOCKS, "div.cell_input, div.highlight"])  # type: ignore[attr-defined]
    assert not found, f"{name} at {PHONE_WIDTH} px scrolls sideways:\n" + "\n".join(
        found
    )
