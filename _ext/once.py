"""Sphinx extension: every script appears once per page.

jupyter-book 1.0 runs the `env-before-read-docs` handlers of sphinx-thebe and
sphinx-togglebutton twice, so each page declared `const THEBE_JS_URL` twice: a
console error in every browser ("Identifier 'THEBE_JS_URL' has already been
declared"), which tests/test_book_browser.py does not allow. This drops the second
copy of any script on a page, keeping the first in place.
"""

from __future__ import annotations

from typing import Any


def _once(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    seen: set[str] = set()
    kept = []
    for script in context.get("script_files", []):
        # file name (None and "" both mean inline) and attributes, the body included
        name = getattr(script, "filename", script) or ""
        key = f"{name}|{sorted(getattr(script, 'attributes', {}).items())}"
        if key not in seen:
            seen.add(key)
            kept.append(script)
    if "script_files" in context:
        context["script_files"][:] = kept


def setup(app: Any) -> dict[str, bool]:
    # early: html-page-context stops at the first handler that returns a template
    app.connect("html-page-context", _once, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
