/* The planner's outputs (book/10b_planner_page.md): a summary line, memory per
   pipeline rank stacked by kind and the step's seconds stacked by part (SVG drawn
   here, as wide as the article and no wider), and two tables with the exact
   numbers. Every number carries data-key / data-value (planner.js's `out`). */
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const W = 700; // the SVG's own units; it scales to the article's width
  const LEFT = 92;
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

  /** Swatches and labels from LEFT, wrapping onto a new row of 16 units at the
      SVG's width; `g.rows` says how many rows it took. */
  function legend(keys, labels, y) {
    const g = svg("g", { class: "dc-plan-legend" });
    let x = LEFT, rows = 1;
    for (const k of keys) {
      const width = 24 + 6.2 * labels[k].length;
      if (x + width > W && x > LEFT) {
        x = LEFT;
        y += 16;
        rows += 1;
      }
      g.append(svg("rect", { x, y, width: 10, height: 10, fill: COLORS[k] }));
      const label = svg("text", { x: x + 14, y: y + 9 }, labels[k]);
      g.append(label);
      x += width;
    }
    g.rows = rows;
    return g;
  }

  /** One horizontal bar of segments: [key, value (BigInt or float), title]. */
  function bar(segments, y, height, scale) {
    const g = svg("g", {});
    let x = LEFT;
    for (const [key, value, color, title] of segments) {
      const width = Math.max(0, Number(value) * scale);
      const rect = T().out("svg:rect", key, value, null, {
        x: x.toFixed(2), y, width: width.toFixed(2), height, fill: color,
      });
      rect.append(svg("title", {}, title));
      g.append(rect);
      x += width;
    }
    return g;
  }

  function summary(p) {
    const { out, gib, seconds } = T();
    const cap = Number(p.hardware.memory);
    return [
      "The model has ", out("b", "params", p.params, (Number(p.params) / 1e9).toFixed(2) + " B"),
      " parameters on ", out("b", "gpus", p.gpus, String(p.gpus)), " GPUs. The fullest GPU peaks at ",
      out("b", "memory.total", p.memory.total, gib(p.memory.total) + " GiB"),
      " during ", out("span", "moment", p.moment, MOMENT_LABELS[p.moment]),
      ", and keeps ", out("span", "reserve", p.reserve, gib(p.reserve) + " GiB"),
      ` free for the CUDA context and NCCL, of its ${gib(cap)} GiB `,
      `(${Math.round(cap / 2 ** 20).toLocaleString("en-US")} MiB): `,
      out("b", "fits", p.fits, p.fits ? "it fits" : "it does not fit", {
        class: p.fits ? "dc-plan-fits" : "dc-plan-over",
      }),
      ". A step takes ", out("b", "time.total", p.time.total, seconds(p.time.total)),
      " (", out("span", "tokens_per_s", p.tokens_per_s,
        Math.round(p.tokens_per_s).toLocaleString("en-US")), " tokens/s, ",
      out("span", "flops", p.flops, (Number(p.flops) / 1e12).toPrecision(3)),
      " TFLOP on the busiest GPU, MFU ",
      out("span", "mfu", p.mfu, (100 * p.mfu).toFixed(1) + " %"), ").",
    ];
  }

  function memoryChart(p) {
    const ranks = p.by_rank, n = ranks.length;
    const height = Math.max(6, Math.min(22, Math.floor(240 / n)));
    const gap = Math.max(2, Math.round(height / 4));
    const top = 18, chart = n * (height + gap);
    const most = ranks.reduce((a, r) => (r.total > a ? r.total : a), 0n);
    const cap = Number(p.hardware.memory);
    const scale = (W - LEFT - 10) / Math.max(Number(most), cap);
    const s = svg("svg", {
      viewBox: `0 0 ${W} ${top + chart + 46}`, class: "dc-plan-svg", role: "img",
      "aria-label": "memory per GPU by kind, one bar per pipeline rank",
    });
    const every = Math.ceil(12 / height);
    ranks.forEach((r, i) => {
      const y = top + i * (height + gap);
      if (i % every === 0 || i === n - 1) {
        s.append(svg("text", { x: LEFT - 6, y: y + height / 2 + 4, "text-anchor": "end" },
          n === 1 ? "every GPU" : `pp rank ${i}`));
      }
      s.append(bar(window.dcPlan.KINDS.map((k) => [`by_rank.${i}.${k}`, r[k], COLORS[k],
        `${KIND_LABELS[k]}: ${T().gib(r[k])} GiB`]), y, height, scale));
      const end = LEFT + Number(r.total) * scale;
      const inside = end > W - 70; // a bar past the line: its total on the bar
      s.append(T().out("svg:text", `by_rank.${i}.total`, r.total, T().gib(r.total), {
        x: inside ? end - 4 : end + 4, y: y + height / 2 + 4,
        "text-anchor": inside ? "end" : "start",
        class: inside ? "dc-plan-on-bar" : "", display: height >= 10 ? "inline" : "none",
      }));
    });
    const x = LEFT + cap * scale;
    s.append(svg("line", { x1: x, x2: x, y1: top - 6, y2: top + chart, class: "dc-plan-cap" }));
    const usable = LEFT + (cap - Number(p.reserve)) * scale;
    s.append(svg("line", {
      x1: usable, x2: usable, y1: top - 2, y2: top + chart, class: "dc-plan-cap",
      "stroke-dasharray": "2,3",
    }));
    s.append(svg("text", { x: Math.min(x, W - 4), y: top - 8, "text-anchor": "end" },
      `GPU memory ${T().gib(cap)} GiB (dotted: less the reserve)`));
    s.append(legend(window.dcPlan.KINDS, KIND_LABELS, top + chart + 10));
    return s;
  }

  function timeChart(p) {
    const scale = (W - LEFT - 10) / p.time.total;
    const s = svg("svg", {
      viewBox: `0 0 ${W} 92`, class: "dc-plan-svg", role: "img",
      "aria-label": "seconds per step by part",
    });
    s.append(svg("text", { x: LEFT - 6, y: 19, "text-anchor": "end" }, "one step"));
    s.append(bar(parts(p).map((k) => [`bar.time.${k}`, p.time[k], color(k),
      `${PART_LABELS[k]}: ${T().seconds(p.time[k])}`]), 4, 22, scale));
    const short = {
      memory: "element-wise", optimizer: "optimizer", tp: "TP", pp: "PP", dp: "DP",
      cp: "CP", ep: "EP",
    };
    const labels = Object.assign({}, PART_LABELS, short);
    const keys = parts(p);
    const g = legend(keys, labels, 40);
    g.querySelectorAll("rect").forEach((r, i) => r.setAttribute("fill", color(keys[i])));
    s.append(g);
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

  window.dcPlannerDraw = { summary, memoryChart, timeChart, tables };
})();
