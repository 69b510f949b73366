r"""Sphinx extension: formulas typeset as MathML when the book is built.

The chapters write formulas in MyST's dollar math ($x^2$ inline, $$...$$ on their
own line; JupyterLab renders the same with its MathJax). Sphinx would load MathJax
from a CDN into every page with math: a reader offline, and the browser test (no
network), would get plain TeX and a console error. Here each formula becomes MathML
at build time (latex2mathml, pure Python), which browsers typeset themselves
(MathML Core: Chromium since 109, Firefox, Safari): no script, nothing fetched.
A formula latex2mathml cannot read fails the build (`make book` runs with -W).
latex2mathml reads one-line formulas well; for lines aligned on their "=" write
\begin{array}{rcl} a & = & b \\ c & = & d \end{array} (its `aligned` gives no
table).
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.util import logging

LOG = logging.getLogger(__name__)
ALIGN = re.compile(r'columnalign="(left|right|center)"')


def _mathml(self: Any, node: nodes.Element, latex: str, display: str) -> str:
    try:
        found = convert(latex.strip(), display=display)
    except Exception as error:  # latex2mathml raises its own kinds of error
        LOG.warning(f"formula {latex!r}: {error}", location=node)
        return f'<code class="dc-math-error">{self.encode(latex)}</code>'
    # \begin{array}{rcl}: MathML Core drops mtd's columnalign; CSS does the same
    return ALIGN.sub(r'columnalign="\1" style="text-align:\1"', found)


def visit_inline(self: Any, node: nodes.Element) -> None:
    self.body.append(
        f'<span class="math notranslate nohighlight">'
        f"{_mathml(self, node, node.astext(), 'inline')}</span>"
    )
    raise nodes.SkipNode


def visit_block(self: Any, node: nodes.Element) -> None:
    number = node.get("number")  # an equation named with a label
    tail = f'<span class="eqno">({number})</span>' if number else ""
    anchor = " ".join(node.get("ids", []))
    where = f' id="{anchor}"' if anchor else ""
    self.body.append(
        f'<div class="math notranslate nohighlight dc-math"{where}>'
        f"{_mathml(self, node, node.astext(), 'block')}{tail}</div>\n"
    )
    raise nodes.SkipNode


def setup(app: Any) -> dict[str, bool]:
    app.add_html_math_renderer(
        "mathml",
        inline_renderers=(visit_inline, None),
        block_renderers=(visit_block, None),
    )
    return {"parallel_read_safe": True, "parallel_write_safe": True}
