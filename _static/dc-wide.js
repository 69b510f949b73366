/* Wide outputs (distcourse). A per-rank grid (div.dc-ranks, launch/columns.py) or a
   table (div.dc-table, tables.Table) whose lines do not fit the text column, a table
   of the prose whose words do not fit it, and a figure made wide (figure.dc-wide, viz.figure(..., wide=True)), take the page's
   full width: 136 % of the column, as sphinx-book-theme's full-width content does
   (_static/custom.css, "dc-wide"). While one is in view the right-hand contents
   fold to their title, and unfold on hover. Only in windows of 1200 px and more,
   where the contents sidebar is shown; narrower, everything keeps the column.
   tests/test_book_browser.py checks what this lays out. */
(() => {
  "use strict";
  const wideWindow = window.matchMedia("(min-width: 1200px)");

  // a table's width at `size`: "max-content" (no line wrapped) or "min-content"
  // (every line wrapped wherever a line may break, no word broken)
  function width(table, size) {
    const before = table.style.width;
    table.style.width = size;
    const found = table.getBoundingClientRect().width;
    table.style.width = before;
    return found;
  }

  // A hyphen or a slash inside a word is a place a browser may break a line
  // ("->", "1e-06", "a/b"): each word that holds one is kept whole (nowrap), so
  // that per-rank columns wrap at spaces only and take the width their words need.
  function keepWordsWhole() {
    for (const cell of document.querySelectorAll(".bd-article .dc-rank-text")) {
      const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      const nodes = [];
      while (walk.nextNode()) nodes.push(walk.currentNode);
      for (const node of nodes) {
        if (!/\S[-/]|[-/]\S/.test(node.textContent)) continue;
        const parts = node.textContent.split(/(\s+)/);
        const frag = document.createDocumentFragment();
        for (const part of parts) {
          if (/[-/]/.test(part) && /\S/.test(part)) {
            const word = document.createElement("span");
            word.className = "dc-word";
            word.textContent = part;
            frag.appendChild(word);
          } else if (part) {
            frag.appendChild(document.createTextNode(part));
          }
        }
        node.replaceWith(frag);
      }
    }
  }

  // Per-rank grids and output tables widen when a line would wrap; tables in the
  // prose (their cells are sentences) only when a word would not fit.
  function widen() {
    if (!wideWindow.matches) return;
    const kinds = [
      [".bd-article div.dc-ranks, .bd-article div.dc-table", "max-content"],
      [".bd-article div.pst-scrollable-table-container", "min-content"],
    ];
    for (const [selector, size] of kinds) {
      for (const box of document.querySelectorAll(selector)) {
        const table = box.querySelector("table");
        if (table && width(table, size) > box.clientWidth + 1) {
          box.classList.add("dc-wide");
        }
      }
    }
  }

  function foldContents() {
    const seen = new Set();
    const watch = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        if (entry.isIntersecting) seen.add(entry.target);
        else seen.delete(entry.target);
      }
      document.body.classList.toggle("dc-wide-in-view", seen.size > 0);
    }, { rootMargin: "0px 0px -20% 0px" });
    document.querySelectorAll(".bd-article .dc-wide").forEach((e) => watch.observe(e));
  }

  document.addEventListener("DOMContentLoaded", () => {
    keepWordsWhole();
    widen();
    foldContents();
  });
})();
