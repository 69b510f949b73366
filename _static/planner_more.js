/* The planner page's tools beyond one prediction (book/10b_planner_page.md):
   - the fastest layouts that fit: _static/plan/search.js (distcourse.plan.search,
     ported) on the form's model, batch, dtypes, GPU and GPU count, keeping its ep
     and cp; the fastest is put in the form, the next ones listed to choose from;
   - a sweep: peak memory and step time against the sequence length or the global
     batch (the form's value times 1/8 ... 8), the layout kept;
   - two layouts side by side: the form now (A) beside one kept (B), on common
     scales.
   Every number carries data-key / data-value, as the form's outputs do; the
   browser test holds them equal to the Python. */
(function () {
  "use strict";
  const SHOWN = 5; // search results listed
  const FACTORS = [1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8]; // the sweep's points

  function D() {
    return window.dcPlannerDraw;
  }

  function T() {
    return window.dcPlannerParts;
  }

  /** 'dp 8 x tp 2 x pp 4, m 16, 1F1B, ZeRO-1, full ckpt, sp' */
  function layoutName(L) {
    const schedule = { "1f1b": "1F1B", gpipe: "GPipe", interleaved: `interleaved x${L.virtual}` };
    const parts = [`dp ${L.dp} x tp ${L.tp} x pp ${L.pp}`];
    if (L.ep > 1n) parts[0] += ` x ep ${L.ep}`;
    if (L.cp > 1n) parts[0] += ` x cp ${L.cp}`;
    parts.push(`m ${L.micro_batches}`);
    if (L.pp > 1n) parts.push(schedule[L.schedule]);
    parts.push(L.zero ? `ZeRO-${L.zero}` : "no ZeRO");
    if (L.ckpt !== "none") parts.push(`${L.ckpt} ckpt`);
    if (L.sp) parts.push("sp");
    if (L.zero === 3n && !L.reshard) parts.push("kept gathered");
    if (L.zero <= 1n && L.bucket_view) parts.push("bucket views");
    return parts.join(", ");
  }

  /* ---- the search ---- */

  function runSearch(view, tools) {
    const { el, out, gib, seconds } = T();
    const box = view.more.search;
    let found, read;
    view.state.search = null;
    try {
      read = tools.values();
      const L = read.data.layout;
      const fixed = L.ep > 1n || L.cp > 1n ? { ep: L.ep, cp: L.cp } : {};
      found = window.dcPlan.search(read.data, read.gpus, fixed);
    } catch (err) {
      box.replaceChildren(el("p", { class: "dc-plan-note" }, "No search: ",
        out("span", "search.error", err.message, err.message)));
      box.hidden = false;
      return;
    }
    view.state.search = found;
    if (!found.length) {
      const cap = gib(read.data.hardware.memory);
      box.replaceChildren(el("p", { class: "dc-plan-note" },
        out("span", "search.count", 0, `No layout of ${read.gpus} GPUs fits`),
        ` this model and batch in ${cap} GiB a GPU: more GPUs, a smaller batch or `,
        "a GPU with more memory."));
      box.hidden = false;
      return;
    }
    tools.useLayout(found[0].layout);
    const rows = found.slice(0, SHOWN).map((p, i) => [
      out("span", `search.${i}.layout`, window.dcPlan.layoutKey(p.layout), layoutName(p.layout)),
      out("span", `search.${i}.memory.total`, p.memory.total, gib(p.memory.total)),
      out("span", `search.${i}.time.total`, p.time.total, seconds(p.time.total)),
      (100 * p.mfu).toFixed(1) + " %",
      i === 0 ? "in the form" : el("button", { type: "button", "data-use": String(i) }, "use"),
    ]);
    const t = D().table(["layout", "peak GiB", "step", "MFU", ""], rows);
    t.classList.add("dc-plan-found");
    t.addEventListener("click", (e) => {
      const i = e.target.dataset && e.target.dataset.use;
      if (i !== undefined) tools.useLayout(found[Number(i)].layout);
    });
    box.replaceChildren(el("p", { class: "dc-plan-note" }, "The fastest of ",
      out("b", "search.count", found.length, found.length.toLocaleString("en-US")),
      " layouts that fit (ties: the one that holds less), now in the form; ",
      "the next ones beneath it (", el("code", {}, "plan.search"),
      " in Python finds the same)."), t);
    box.hidden = false;
  }

  /* ---- the sweep ---- */

  /** The sweep's points: [x, prediction or the reason it is impossible]. */
  function sweepPoints(read, over) {
    const now = over === "seq" ? read.data.model.seq : read.data.batch;
    const points = [];
    for (const f of FACTORS) {
      const x = Number(now) * f;
      if (!Number.isInteger(x) || x < 1) continue;
      const data = Object.assign({}, read.data);
      if (over === "seq") data.model = Object.assign({}, data.model, { seq: BigInt(x) });
      else data.batch = BigInt(x);
      try {
        points.push([x, window.dcPlan.predict(data, read.gpus)]);
      } catch (err) {
        points.push([x, err.message]);
      }
    }
    return points;
  }

  function ticks(most) {
    const step = 10 ** Math.floor(Math.log10(most / 4 || 1));
    const nice = [1, 2, 2.5, 5, 10].map((k) => k * step).find((s) => most / s <= 5);
    const out = [];
    for (let v = 0; v <= most * 1.0001; v += nice) out.push(v);
    return out;
  }

  /** One panel: y (a number per point) against x on a log2 axis. */
  function panel(points, key, y, unit, limit, now, width) {
    const { svg } = D();
    const H = 190, left = 46, right = 10, top = 22, bottom = 36;
    const s = D().canvas(width, H, `${unit} against the sweep's values`);
    const ok = points.filter(([, p]) => typeof p !== "string");
    const most = Math.max(...ok.map(([, p]) => y(p)), limit || 0) * 1.08 || 1;
    const xs = points.map(([x]) => x);
    const lx = (x) => left + ((Math.log2(x) - Math.log2(xs[0]))
      / Math.max(1, Math.log2(xs[xs.length - 1]) - Math.log2(xs[0]))) * (width - left - right);
    const ly = (v) => top + (1 - v / most) * (H - top - bottom);
    s.append(svg("text", { x: 4, y: 12 }, unit));
    for (const v of ticks(most / 1.08)) {
      s.append(svg("line", { x1: left, x2: width - right, y1: ly(v), y2: ly(v), class: "dc-plan-grid" }));
      s.append(svg("text", { x: left - 4, y: ly(v) + 4, "text-anchor": "end" }, String(+v.toPrecision(3))));
    }
    for (const x of xs) {
      const label = x >= 1024 && x % 1024 === 0 ? `${x / 1024}k` : String(x);
      s.append(svg("text", {
        x: lx(x), y: H - bottom + 16, "text-anchor": "middle",
        class: x === now ? "dc-plan-now" : "",
      }, label));
    }
    if (limit) {
      s.append(svg("line", { x1: left, x2: width - right, y1: ly(limit), y2: ly(limit), class: "dc-plan-cap" }));
    }
    const line = ok.map(([x, p]) => `${lx(x).toFixed(1)},${ly(y(p)).toFixed(1)}`).join(" ");
    s.append(svg("polyline", { points: line, class: "dc-plan-line" }));
    points.forEach(([x, p], i) => {
      if (typeof p === "string") return;
      s.append(T().out("svg:circle", `sweep.${i}.${key}`, key === "memory.total"
        ? p.memory.total : p.time.total, null, {
        cx: lx(x), cy: ly(y(p)), r: x === now ? 5 : 3.5,
        class: p.fits ? "dc-plan-point" : "dc-plan-point dc-plan-over",
      }));
    });
    return s;
  }

  function drawSweep(view) {
    const box = view.more.sweep, read = view.state.read;
    if (!read || !view.state.p) return;
    const { el, out, gib } = T();
    const over = view.more.over.value;
    const points = sweepPoints(read, over);
    const now = Number(over === "seq" ? read.data.model.seq : read.data.batch);
    const width = box.clientWidth || 600;
    const wide = width >= 560;
    const w = wide ? Math.floor((width - 16) / 2) : width;
    const hw = read.data.hardware;
    const limit = (Number(hw.memory) - Number(view.state.p.reserve)) / 2 ** 30;
    const memory = panel(points, "memory.total", (p) => Number(p.memory.total) / 2 ** 30,
      "peak GiB a GPU", limit, now, w);
    const time = panel(points, "time.total", (p) => p.time.total, "seconds a step",
      0, now, w);
    const xs = el("div", { class: "dc-plan-xs" }, ...points.map(([x, p], i) =>
      out("span", `sweep.${i}.x`, x, "", typeof p === "string" ? { "data-error": p } : {
        "data-fits": String(p.fits),
      })));
    const impossible = points.filter(([, p]) => typeof p === "string");
    const notes = impossible.map(([x, why]) => el("li", {}, `${x}: ${why}`));
    const name = over === "seq" ? "sequence length (tokens)" : "global batch (sequences)";
    box.replaceChildren(el("div", { class: "dc-plan-pair" }, memory, time), xs,
      el("p", { class: "dc-plan-note" }, `Against the ${name}, the rest of the form as it `,
        `is; a hollow point does not fit in ${gib(hw.memory)} GiB less the reserve ` +
        "(the dashed line)." + (impossible.length ? " Not possible:" : "")),
      ...(impossible.length ? [el("ul", { class: "dc-plan-note" }, ...notes)] : []));
    box.querySelectorAll("svg").forEach(D().keepInside);
  }

  /* ---- two layouts side by side ---- */

  function describe(p) {
    return `${(Number(p.params) / 1e9).toFixed(2)} B parameters (${p.model.layers} x ` +
      `${p.model.hidden}), batch ${p.batch} x ${p.model.seq} tokens, ${p.gpus} x ` +
      `${p.hardware.name}, ${p.policy.dtype}`;
  }

  function compareBars(a, b, width) {
    const { svg } = D();
    const rows = [["peak GiB a GPU", (p) => Number(p.memory.total), "memory.total",
      (v) => T().gib(v)], ["seconds a step", (p) => p.time.total, "time.total",
      (v) => T().seconds(v)]];
    const H = 2 * (2 * 22 + 30);
    const s = D().canvas(width, H, "A and B on common scales: peak memory, step time");
    const left = 30, right = D().CHAR * 9;
    rows.forEach(([title, f, key, text], j) => {
      const y0 = j * 74;
      s.append(svg("text", { x: 4, y: y0 + 12 }, `${title} (common scale)`));
      const most = Math.max(f(a), f(b));
      [["A", a], ["B", b]].forEach(([name, p], i) => {
        const y = y0 + 18 + i * 24, w = (f(p) / most) * (width - left - right);
        s.append(svg("text", { x: 4, y: y + 15 }, name));
        s.append(T().out("svg:rect", `compare.${name.toLowerCase()}.bar.${key}`,
          key === "memory.total" ? p.memory.total : p.time.total, null, {
          x: left, y, width: w.toFixed(2), height: 20,
          fill: name === "A" ? "#0072B2" : "#E69F00",
        }));
        s.append(svg("text", { x: left + w + 4, y: y + 15, class: "dc-plan-value" },
          text(key === "memory.total" ? p.memory.total : p.time.total)));
      });
    });
    return s;
  }

  function drawCompare(view) {
    const box = view.more.compare, b = view.state.kept, a = view.state.p;
    const { el, out, gib, seconds } = T();
    view.more.clear.disabled = view.more.load.disabled = !b;
    if (!b || !a) {
      box.replaceChildren(el("p", { class: "dc-plan-note" }, b
        ? "A is impossible: see the message above."
        : "Keep the form's layout as B, change the form, and the two are compared here."));
      return;
    }
    const row = (label, f) => [label, f(a, "a"), f(b, "b")];
    const rows = [
      row("what", (p) => describe(p)),
      row("layout", (p) => layoutName(window.dcPlan.planLayout(p.layout))),
      row("peak a GPU", (p, k) => out("span", `compare.${k}.memory.total`, p.memory.total,
        `${gib(p.memory.total)} GiB` + (p.fits ? ", fits" : ", does not fit"))),
      row("step", (p, k) => out("span", `compare.${k}.time.total`, p.time.total,
        seconds(p.time.total))),
      row("tokens/s", (p, k) => out("span", `compare.${k}.tokens_per_s`, p.tokens_per_s,
        Math.round(p.tokens_per_s).toLocaleString("en-US"))),
      row("MFU", (p, k) => out("span", `compare.${k}.mfu`, p.mfu, (100 * p.mfu).toFixed(1) + " %")),
      row("on the wire a step", (p, k) => out("span", `compare.${k}.wire`,
        Object.values(p.wire).reduce((x, y) => x + y, 0n),
        gib(Object.values(p.wire).reduce((x, y) => x + y, 0n)) + " GiB")),
    ];
    const t = D().table(["", "A: the form now", "B: kept"], rows);
    t.classList.add("dc-plan-compare-table");
    box.replaceChildren(t, compareBars(a, b, box.clientWidth || 600));
  }

  /* ---- built once, refreshed on every input ---- */

  function build(root, view, tools) {
    const { el } = T();
    const search = el("div", { class: "dc-plan-search" });
    search.hidden = true;
    const over = el("select", { name: "sweep", "aria-label": "sweep over" },
      el("option", { value: "seq" }, "the sequence length"),
      el("option", { value: "batch" }, "the global batch"));
    const keep = el("button", { type: "button", class: "dc-plan-keep" }, "Keep the form as B");
    const load = el("button", { type: "button", class: "dc-plan-load" }, "Put B in the form");
    const clear = el("button", { type: "button", class: "dc-plan-forget" }, "Forget B");
    view.more = {
      search, over, clear, load,
      sweep: el("div", { class: "dc-plan-sweep" }),
      compare: el("div", { class: "dc-plan-compare" }),
    };
    view.outputs.append(search,
      el("h4", {}, "Sweep: memory and time against ", over), view.more.sweep,
      el("h4", {}, "Two layouts side by side ", keep, " ", load, " ", clear),
      view.more.compare);
    root.addEventListener("click", (e) => {
      if (e.target.classList.contains("dc-plan-find")) runSearch(view, tools);
    });
    over.addEventListener("change", () => drawSweep(view));
    keep.addEventListener("click", () => {
      if (!view.state.p) return;
      view.state.kept = view.state.p;
      view.state.keptForm = tools.snapshot();
      drawCompare(view);
    });
    load.addEventListener("click", () => view.state.keptForm && tools.restore(view.state.keptForm));
    clear.addEventListener("click", () => {
      view.state.kept = view.state.keptForm = null;
      drawCompare(view);
    });
  }

  /** An input changed: the search's list no longer answers the form. */
  function inputChanged(view) {
    if (view.more) view.more.search.hidden = true;
  }

  /** After every input: the comparison now, the sweep (seven predictions) once
      the typing of this turn is done, so that a burst of inputs draws it once. */
  function refresh(view) {
    drawCompare(view);
    if (!view.more.pending) {
      view.more.pending = true;
      setTimeout(() => {
        view.more.pending = false;
        drawSweep(view);
      }, 0);
    }
  }

  window.dcPlannerMore = { build, refresh, inputChanged, layoutName, sweepPoints, FACTORS };
})();
