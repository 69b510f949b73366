/* The planner's outputs (book/10b_planner_page.md): a summary line, memory per
   pipeline rank stacked by kind and the step's seconds stacked by part, and two
   tables with the exact numbers. The charts are SVG drawn at the pixel width of
   their box (text at 12 px, as the book's smallest), value labels beside their
   bar, never on it; the step's bar is on a logarithmic time axis, the same for
   every input, so that 2 s and 40 s look different. Every number carries
   data-key / data-value (planner.js's `out`). */
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const FONT = 12; // px: the book's smallest text
  const CHAR = 7; // px: a character of the charts' font, about
  const LEFT = 78; // px: the bars' labels ("pp rank 12")
  const COLORS = {
    parameters: "#0072B2", gradients: "#E69F00", optimizer: "#009E73",
    activations: "#CC79A7", loss: "#D55E00", temporaries: "#F0E442",
    buffers: "#56B4E9", workspace: "#999999",
    compute: "#0072B2", memory: "#56B4E9", optimizer_step: "#009E73",
    bubble: "#999999", tp: "#D55E00", pp: "#F0E442", dp: "#CC79A7",
    cp: "#882255", ep: "#332288",
  };
  const KIND_LABELS = {
    parameters: "parameters", gradients: "gradients", optimizer: "optimizer state",
    activations: "activations", loss: "loss region", temporaries: "temporaries",
    buffers: "buffers", workspace: "cuBLAS workspace",
  };
  const MOMENT_LABELS = {
    loss: "the loss's backward", backward: "a block's backward",
    step: "the optimizer's step",
  };
  const PART_LABELS = {
    compute: "matmuls", memory: "element-wise work", optimizer: "optimizer step",
    bubble: "pipeline bubble", tp: "tensor-parallel messages",
    pp: "pipeline messages", dp: "data-parallel messages (not hidden)",
    cp: "context-parallel messages", ep: "expert-parallel messages",
  };
  const PART_SHORT = {
    compute: "matmuls", memory: "element-wise", optimizer: "optimizer",
    bubble: "bubble", tp: "TP", pp: "PP", dp: "DP", cp: "CP", ep: "EP",
  };
  // the time axis: decades from 1 ms to 1000 s, widened to hold any step
  const AXIS = [1e-3, 1e3];

  /** The step's parts: cp and ep where the layout has them (time's keys). */
  function parts(p) {
    return ["compute", "memory", "optimizer", "bubble", "tp", "pp", "dp", "cp", "ep"]
      .filter((k) => k in p.time);
  }

  function color(part) {
    return part === "optimizer" ? COLORS.optimizer_step : COLORS[part];
  }

  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }

  function T() {
    return window.dcPlannerParts;
  }

  /** The SVG of a chart `width` px wide (its box's), `height` px high. */
  function canvas(width, height, label) {
    return svg("svg", {
      width, height, viewBox: `0 0 ${width} ${height}`, class: "dc-plan-svg",
      role: "img", "aria-label": label,
    });
  }

  /** Swatches and labels from `left`, wrapping at `width`; `g.rows` rows. */
  function legend(keys, labels, colors, y, width, left) {
    const g = svg("g", { class: "dc-plan-legend" });
    let x = left, rows = 1;
    for (const k of keys) {
      const w = 22 + CHAR * labels[k].length;
      if (x + w > width && x > left) {
        x = left;
        y += FONT + 6;
        rows += 1;
      }
      g.append(svg("rect", { x, y: y + 1, width: 10, height: 10, fill: colors(k) }));
      g.append(svg("text", { x: x + 14, y: y + 10 }, labels[k]));
      x += w;
    }
    g.rows = rows;
    return g;
  }

  /** One horizontal bar of segments [key, value, color, title] from x0. */
  function bar(segments, x0, y, height, scale, cls) {
    const g = svg("g", { class: cls || "dc-plan-bar" });
    let x = x0;
    for (const [key, value, fill, title] of segments) {
      const width = Math.max(0, Number(value) * scale);
      const rect = T().out("svg:rect", key, value, null, {
        x: x.toFixed(2), y, width: width.toFixed(2), height, fill,
      });
      rect.append(svg("title", {}, title));
      g.append(rect);
      x += width;
    }
    return g;
  }

  /** TFLOP, three digits or whole thousands: '765', '7,430'. */
  function tera(flops) {
    const t = Number(flops) / 1e12;
    return t < 1000 ? t.toPrecision(3) : Math.round(t).toLocaleString("en-US");
  }

  function summary(p) {
    const { out, gib, seconds } = T();
    const cap = Number(p.hardware.memory);
    const pieces = [
      "The model has ", out("b", "params", p.params, (Number(p.params) / 1e9).toFixed(2) + " B"),
      " parameters on ", out("b", "gpus", p.gpus, String(p.gpus)), " GPUs. The fullest GPU peaks at ",
      out("b", "memory.total", p.memory.total, gib(p.memory.total) + " GiB"),
      " during ", out("span", "moment", p.moment, MOMENT_LABELS[p.moment]),
      ", and keeps ", out("span", "reserve", p.reserve, gib(p.reserve) + " GiB"),
      ` for the CUDA context and NCCL, of its ${gib(cap)} GiB: `,
      out("b", "fits", p.fits, p.fits ? "it fits" : "it does not fit", {
        class: p.fits ? "dc-plan-fits" : "dc-plan-over",
      }),
    ];
    if (!p.fits) {
      pieces.push(" (", T().el("button", { type: "button", class: "dc-plan-find" },
        "find the fastest layout that fits"), ")");
    }
    pieces.push(". A step takes ", out("b", "time.total", p.time.total, seconds(p.time.total)),
      " (", out("span", "tokens_per_s", p.tokens_per_s,
        Math.round(p.tokens_per_s).toLocaleString("en-US")), " tokens/s, ",
      out("span", "flops", p.flops, tera(p.flops)),
      " TFLOP on the busiest GPU, MFU ",
      out("span", "mfu", p.mfu, (100 * p.mfu).toFixed(1) + " %"), ").");
    return pieces;
  }

  function memoryChart(p, width) {
    const W = Math.max(280, width || 460);
    const ranks = p.by_rank, n = ranks.length;
    const height = Math.max(6, Math.min(20, Math.floor(200 / n)));
    const gap = Math.max(2, Math.round(height / 4));
    const top = FONT + 10, chart = n * (height + gap);
    const most = ranks.reduce((a, r) => (r.total > a ? r.total : a), 0n);
    const cap = Number(p.hardware.memory);
    const right = CHAR * 6 + 8; // the totals' room, right of the longest bar
    const scale = (W - LEFT - right) / Math.max(Number(most), cap);
    const kinds = window.dcPlan.KINDS;
    const keys = kinds.filter((k) => ranks.some((r) => r[k] > 0n));
    const probe = legend(keys, KIND_LABELS, (k) => COLORS[k], 0, W, 4);
    const s = canvas(W, top + chart + 10 + probe.rows * (FONT + 6),
      "memory per GPU by kind, one bar per pipeline rank");
    const every = Math.ceil((FONT + 2) / (height + gap));
    ranks.forEach((r, i) => {
      const y = top + i * (height + gap);
      if (i % every === 0 || i === n - 1) {
        s.append(svg("text", { x: LEFT - 6, y: y + height / 2 + 4, "text-anchor": "end" },
          n === 1 ? "every GPU" : `pp rank ${i}`));
      }
      s.append(bar(kinds.map((k) => [`by_rank.${i}.${k}`, r[k], COLORS[k],
        `${KIND_LABELS[k]}: ${T().gib(r[k])} GiB`]), LEFT, y, height, scale));
      s.append(T().out("svg:text", `by_rank.${i}.total`, r.total, T().gib(r.total), {
        x: LEFT + Number(r.total) * scale + 4, y: y + height / 2 + 4,
        class: "dc-plan-value", display: height + gap >= FONT ? "inline" : "none",
      }));
    });
    const x = LEFT + cap * scale;
    s.append(svg("line", { x1: x, x2: x, y1: top - 4, y2: top + chart, class: "dc-plan-cap" }));
    const usable = LEFT + (cap - Number(p.reserve)) * scale;
    s.append(svg("line", {
      x1: usable, x2: usable, y1: top, y2: top + chart, class: "dc-plan-cap",
      "stroke-dasharray": "2,3",
    }));
    const note = `GPU memory ${T().gib(cap)} GiB (dotted: less the reserve)`;
    const end = Math.min(x + 3, W - 2); // ends at the line, or starts there
    s.append(svg("text", end - CHAR * note.length >= 0
      ? { x: end, y: FONT, "text-anchor": "end" } : { x: Math.max(2, x - 3), y: FONT }, note));
    s.append(legend(keys, KIND_LABELS, (k) => COLORS[k], top + chart + 8, W, 4));
    return s;
  }

  /** x of `t` seconds on the time axis [lo, hi] over [x0, x1], logarithmic. */
  function timeX(t, lo, hi, x0, x1) {
    return x0 + ((Math.log10(t) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * (x1 - x0);
  }

  /** The time axis holding `t`: AXIS, widened by whole decades. */
  function timeAxis(t) {
    const lo = Math.min(AXIS[0], 10 ** (Math.floor(Math.log10(t)) - 1));
    const hi = Math.max(AXIS[1], 10 ** Math.ceil(Math.log10(t)));
    return [lo, hi];
  }

  function decade(t) {
    if (t < 1e-3) return `${Math.round(t * 1e6)} µs`;
    return t < 1 ? `${Math.round(t * 1e3)} ms` : `${Math.round(t)} s`;
  }

  function timeChart(p, width) {
    const W = Math.max(280, width || 460);
    const total = p.time.total;
    const [lo, hi] = timeAxis(total);
    const x0 = 24, x1 = W - CHAR * 7 - 6; // room for the end ticks, the total's label
    const keys = parts(p);
    const probe = legend(keys, PART_SHORT, color, 0, W, 4);
    const barY = 4, barH = 22, axisY = barY + barH + 6;
    const s = canvas(W, axisY + FONT + 14 + probe.rows * (FONT + 6),
      "seconds per step by part, on a logarithmic time axis");
    const end = timeX(total, lo, hi, x0, x1);
    const scale = (end - x0) / total; // the parts share the bar in proportion
    s.append(bar(keys.map((k) => [`bar.time.${k}`, p.time[k], color(k),
      `${PART_LABELS[k]}: ${T().seconds(p.time[k])}`]), x0, barY, barH, scale));
    s.append(T().out("svg:text", "bar.time.total", total, T().seconds(total), {
      x: end + 4, y: barY + barH / 2 + 4, class: "dc-plan-value",
    }));
    const axis = svg("g", { class: "dc-plan-axis" });
    axis.append(svg("line", { x1: x0, x2: x1, y1: axisY, y2: axisY }));
    for (let k = Math.round(Math.log10(lo)); k <= Math.round(Math.log10(hi)); k++) {
      const x = timeX(10 ** k, lo, hi, x0, x1);
      axis.append(svg("line", { x1: x, x2: x, y1: axisY, y2: axisY + 4 }));
      axis.append(svg("text", {
        x, y: axisY + FONT + 4, "text-anchor": "middle", "data-tick": String(k),
      }, decade(10 ** k)));
    }
    s.append(axis);
    s.append(legend(keys, PART_SHORT, color, axisY + FONT + 10, W, 4));
    return s;
  }

  function table(head, rows) {
    const { el } = T();
    const t = el("table", { class: "dc-plan-table" });
    t.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))));
    const body = el("tbody", {});
    for (const row of rows) body.append(el("tr", {}, ...row.map((c) => el("td", {}, c))));
    t.append(body);
    return t;
  }

  function tables(p) {
    const { out, gib, seconds } = T();
    const kinds = window.dcPlan.KINDS.map((k) => [KIND_LABELS[k],
      out("span", `peak.${k}`, p.peak[k], gib(p.peak[k])),
      out("span", `memory.${k}`, p.memory[k], gib(p.memory[k]))]);
    kinds.push(["total", out("span", "peak.total", p.peak.total, gib(p.peak.total)),
      gib(p.memory.total)]);
    const moments = Object.keys(p.moments).map((m) => [`at ${MOMENT_LABELS[m]}`,
      out("span", `moments.${m}`, p.moments[m], gib(p.moments[m])), ""]);
    const steps = parts(p).map((k) => [PART_LABELS[k],
      out("span", `time.${k}`, p.time[k], seconds(p.time[k])),
      k in p.messages ? out("span", `messages.${k}`, p.messages[k], seconds(p.messages[k])) : "",
      k in p.wire ? out("span", `wire.${k}`, p.wire[k], gib(p.wire[k])) : ""]);
    return [
      table(["the fullest GPU holds", "GiB at its peak", "GiB at its largest"],
        kinds.concat(moments)),
      table(["a step spends", "time", "messages' own time", "GiB on the wire"], steps),
    ];
  }

  /** Shift any text of `s` (in the page) that reaches past its edges back in:
      the widths above are estimates, the browser's are measured here. */
  function keepInside(s) {
    const width = Number(s.getAttribute("width"));
    for (const t of s.querySelectorAll("text")) {
      const box = t.getBBox();
      const shift = box.x < 1 ? 1 - box.x : Math.min(0, width - 1 - box.x - box.width);
      if (shift) t.setAttribute("x", Number(t.getAttribute("x")) + shift);
    }
  }

  window.dcPlannerDraw = {
    keepInside,
    summary, memoryChart, timeChart, tables, table, svg, canvas, legend, bar, parts,
    COLORS, FONT, CHAR, KIND_LABELS, PART_SHORT, MOMENT_LABELS, timeX, timeAxis,
  };
})();
