"""distcourse.viz.pages: the Markdown pages' figures, stored as drawn."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from distcourse.viz import pages  # noqa: E402

PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def masked(html: str) -> str:
    """The figure's HTML with its PNG's bytes masked, as book/nbval.cfg masks them."""
    return PNG.sub("data:image/png;base64,PNG", html)


def test_every_stored_page_figure_is_what_the_package_draws(tmp_path: Path) -> None:
    drawn = pages.write(tmp_path)
    assert {p.name for p in drawn} == set(pages.PAGES)
    for path in drawn:
        stored = pages.FOLDER / path.name
        assert stored.exists(), f"{stored} is missing: python -m distcourse.viz.pages"
        assert masked(stored.read_text()) == masked(path.read_text()), (
            f"{stored} differs from what distcourse.viz.pages draws: run "
            "`python -m distcourse.viz.pages` and commit book/figures"
        )


def test_a_page_is_included_by_the_page_that_shows_it() -> None:
    intro = (pages.FOLDER.parent / "intro.md").read_text()
    assert ":file: figures/strategies.html" in intro
    html = pages.strategy_map().html()
    assert html.startswith('<figure class="dc-figure" id="figure-1"')
    assert "Figure 1.</span> What each strategy splits" in html
