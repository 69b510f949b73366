/* The book's reading, measured in one page (tests/test_book_browser.py, READING):
   the figures (caption, alt text, smallest text at the size shown), the body's
   smallest text, table lines that wrap, per-rank words broken across lines,
   formulas written as plain text, paragraphs over maxWords words, the takeaways
   and pitfall boxes. Lines are counted from the browser's layout: a range per
   source line (or word), and the distinct tops of its boxes. */
(maxWords) => {
  const article = document.querySelector(".bd-article");
  const tops = (range) => new Set([...range.getClientRects()]
    .filter((r) => r.width > 0).map((r) => Math.round(r.top))).size;
  const textNodes = (el) => {
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const out = [];
    while (walk.nextNode()) out.push(walk.currentNode);
    return out;
  };
  // a range over characters [start, end) of the text nodes `nodes`
  const rangeOver = (nodes, start, end) => {
    const range = document.createRange();
    let at = 0;
    let begun = false;
    for (const n of nodes) {
      const len = n.textContent.length;
      if (!begun && start <= at + len) { range.setStart(n, start - at); begun = true; }
      if (begun && end <= at + len) { range.setEnd(n, end - at); return range; }
      at += len;
    }
    return range;
  };
  // the lines of `el` (split at newlines) that take more than one line on screen
  const wrapped = (el) => {
    const nodes = textNodes(el);
    const text = nodes.map((n) => n.textContent).join("");
    const out = [];
    let start = 0;
    for (const line of text.split("\n")) {
      const end = start + line.length;
      if (line.trim() && tops(rangeOver(nodes, start, end)) > 1) out.push(line.trim());
      start = end + 1;
    }
    return out;
  };
  // a line of a text table: two or more gaps of two spaces between words
  const tabular = (line) => (line.match(/\S {2,}(?=\S)/g) || []).length >= 2;

  const figures = [...article.querySelectorAll("img")].map((img) => {
    const fig = img.closest("figure");
    const caption = fig && fig.querySelector("figcaption");
    const min = fig && parseFloat(fig.dataset.minTextPx);
    const natural = parseFloat(img.getAttribute("width"));
    return {
      caption: caption ? caption.innerText.trim() : "",
      alt: img.alt || "",
      shown: min && natural ? (min * img.clientWidth) / natural : null,
    };
  });
  const bodyFonts = [...article.querySelectorAll("p, li, td, pre, .dc-rank-text")]
    .filter((e) => e.innerText.trim())
    .map((e) => parseFloat(getComputedStyle(e).fontSize));

  const tables = [];
  for (const cell of article.querySelectorAll("div.dc-table td, div.dc-table th")) {
    tables.push(...wrapped(cell).map((l) => "table cell: " + l));
  }
  for (const pre of article.querySelectorAll("div.cell_output pre, .dc-rank-text")) {
    if (pre.innerText.split("\n").filter(tabular).length >= 3) {
      tables.push(...wrapped(pre).filter(tabular).map((l) => "text table: " + l));
    }
  }

  const broken = [];
  for (const cell of article.querySelectorAll(".dc-rank-text")) {
    const nodes = textNodes(cell);
    const text = nodes.map((n) => n.textContent).join("");
    for (const m of text.matchAll(/\S+/g)) {
      if (tops(rangeOver(nodes, m.index, m.index + m[0].length)) > 1) broken.push(m[0]);
    }
  }

  // a formula written as text: a power, a sum, a root, Psi, a super- or subscript
  // digit, a minus sign (U+2212) or a middle dot between terms, ") / ("
  const FORMULA = new RegExp([
    "\\^", "[\u03a3\u2211\u221a\u03a8\u2202\u220f\u222b]",
    "[\u2070\u00b9\u00b2\u00b3\u2074-\u2079\u1d40\u2080-\u2089\u1d62\u2c7c\u2096\u2099\u1d63\u2091\u2093]",
    "\\w ?\u2212 ?\\w", "\\w\u00b7\\w", "\\) ?/ ?\\(",
  ].join("|"));
  const seen = new Set();
  for (const el of article.querySelectorAll("p, li, td, th, figcaption, h1, h2, h3, h4")) {
    for (const n of textNodes(el)) {
      const skip = "code, pre, math, .math, .highlight, .cell_output, .dc-table";
      if (n.parentElement.closest(skip)) continue;
      if (FORMULA.test(n.textContent)) seen.add(n);
    }
  }
  const plain = [...seen].map((n) => n.textContent.trim().replace(/\s+/g, " ").slice(0, 80));

  const words = (e) => e.innerText.trim().split(/\s+/).filter(Boolean).length;
  const long = [...article.querySelectorAll("p, li")]
    .filter((e) => !e.querySelector("p, li") && !e.closest(".dc-ranks, .cell_output"))
    .filter((e) => words(e) > maxWords)
    .map((e) => `${words(e)} words: ` + e.innerText.slice(0, 60));

  const pitfalls = [...article.querySelectorAll("section")].find((s) => {
    const head = s.querySelector(":scope > h2");
    return head && /^pitfalls/i.test(head.innerText.trim());
  });
  return {
    figures,
    bodySmallest: Math.min(...bodyFonts),
    tables,
    broken,
    plain,
    long,
    math: article.querySelectorAll("math").length,
    takeaways: [...article.querySelectorAll(".admonition.dc-takeaways")]
      .map((b) => b.querySelectorAll("li").length),
    pitfallSection: Boolean(pitfalls),
    pitfallBoxes: (pitfalls || article).querySelectorAll(".admonition.dc-pitfall").length,
  };
}
