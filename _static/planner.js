/* The interactive planner of book/10b_planner_page.md: a form of inputs (the key
   names of distcourse.plan's to_dict), and on every keystroke the prediction of
   _static/plan/*.js drawn as memory per pipeline rank stacked by kind and seconds
   per step by part (planner_draw.js), with a search for the fastest layout that
   fits, a sweep and a comparison of two layouts (planner_more.js). dp follows the
   GPU count (dp = GPUs / (tp x pp x ep x cp)) until the reader types a dp of
   their own. Runs only on a page with <div id="dc-planner">; nothing is fetched.
   Every number shown carries its exact value in data-key / data-value
   (tests/test_book_browser_planner.py reads them and compares with the Python). */
(function () {
  "use strict";
  const GIB = 2 ** 30;
  const SVG = "http://www.w3.org/2000/svg";
  // ModelSpec.from_params(N) for N = 1e9 ... 175e9 (seq 4096, vocab 32000), as the
  // CLI's --params derives them; the browser test holds them equal.
  const MODELS = {
    "1b": ["1B", [16, 2048, 16, 4096, 32000]],
    "7b": ["7B", [32, 4096, 32, 4096, 32000]],
    "13b": ["13B", [40, 5120, 40, 4096, 32000]],
    "70b": ["70B", [68, 9216, 72, 4096, 32000]],
    "175b": ["175B", [96, 12288, 96, 4096, 32000]],
  };
  const MODEL_KEYS = ["layers", "hidden", "heads", "seq", "vocab"];
  const MOE_KEYS = ["experts", "top_k", "capacity_factor"]; // a preset leaves them
  const LAYOUT_KEYS = ["dp", "tp", "pp", "micro_batches", "sp", "ckpt", "schedule",
    "virtual", "bucket_view", "ep", "cp", "reshard"];
  const SHARE_KEYS = ["gpus", "tp", "pp", "ep", "cp"]; // what dp follows

  /* ---- the form ---- */

  // [group, key, label, kind, default, options]: kind int, float, select, check.
  // Groups: model, run, policy, moe (folded), hardware, sheet (folded), layout.
  const FIELDS = [
    ["model", "preset", "model", "select", "7b",
      Object.entries(MODELS).map(([k, v]) => [k, v[0]]).concat([["custom", "custom"]])],
    ["model", "layers", "layers (blocks)", "int", 32],
    ["model", "hidden", "hidden size", "int", 4096],
    ["model", "heads", "attention heads", "int", 32],
    ["model", "seq", "sequence (tokens)", "int", 4096],
    ["model", "vocab", "vocabulary", "int", 32000],
    ["run", "batch", "global batch (sequences)", "int", 256],
    ["policy", "dtype", "dtype policy", "select", "bf16",
      [["fp32", "fp32"], ["bf16", "bf16 weights, fp32 master"],
        ["amp-bf16", "fp32 weights, bf16 autocast"]]],
    ["policy", "reduce", "gradients reduced in", "select", "bf16",
      [["fp32", "fp32"], ["bf16", "bf16"]]],
    ["policy", "optimizer", "optimizer", "select", "adamw",
      [["adamw", "AdamW (foreach)"], ["adamw-fused", "AdamW (fused)"], ["sgd", "SGD"]]],
    ["moe", "experts", "experts a block (0: dense)", "int", 0],
    ["moe", "top_k", "experts a token (top-k)", "int", 1],
    ["moe", "capacity_factor", "expert capacity factor", "float", 1.25],
    ["moe", "ep", "expert parallel ep", "int", 1],
    ["moe", "cp", "context parallel cp", "int", 1],
    ["hardware", "gpu", "GPU", "select", "h100",
      [["h100", "H100 SXM"], ["h200", "H200 SXM"], ["a100", "A100 SXM"]]],
    ["hardware", "gpus", "GPUs", "int", 64],
    ["hardware", "memory_mib", "memory (MiB, as nvidia-smi)", "float", 81559],
    ["hardware", "gpus_per_node", "GPUs per node", "int", 8],
    ["sheet", "tflops_bf16", "peak TFLOP/s, bf16", "float", 989.5],
    ["sheet", "efficiency_bf16", "share of bf16 peak reached", "float", 0.65],
    ["sheet", "tflops_fp32", "peak TFLOP/s, fp32", "float", 67],
    ["sheet", "efficiency_fp32", "share of fp32 peak reached", "float", 0.8],
    ["sheet", "bandwidth_tbs", "memory bandwidth (TB/s)", "float", 3.35],
    ["sheet", "efficiency_memory", "share of bandwidth reached", "float", 0.8],
    ["sheet", "workspace_mib", "cuBLAS workspace (MiB)", "float", 64],
    ["sheet", "context_mib", "CUDA context (MiB)", "float", 512],
    ["sheet", "nccl_mib", "NCCL buffers a group (MiB)", "float", 512],
    ["sheet", "node_gbs", "in-node GB/s (one way)", "float", 450],
    ["sheet", "network_gbs", "network GB/s", "float", 50],
    ["sheet", "alpha_node_us", "in-node latency (µs)", "float", 5],
    ["sheet", "alpha_network_us", "network latency (µs)", "float", 10],
    ["layout", "dp", "data parallel dp", "int", 16],
    ["layout", "tp", "tensor parallel tp", "int", 2],
    ["layout", "pp", "pipeline stages pp", "int", 2],
    ["layout", "micro_batches", "micro-batches m", "int", 8],
    ["layout", "schedule", "schedule", "select", "1f1b",
      [["1f1b", "1F1B"], ["gpipe", "GPipe"], ["interleaved", "interleaved"]]],
    ["layout", "virtual", "stages a rank (interleaved)", "int", 1],
    ["layout", "zero", "ZeRO stage", "select", "0",
      [["0", "0 (none)"], ["1", "1"], ["2", "2"], ["3", "3 (FSDP)"]]],
    ["layout", "ckpt", "checkpointing", "select", "none",
      [["none", "none"], ["selective", "selective"], ["full", "full"]]],
    ["layout", "sp", "sequence parallel", "check", true],
    ["layout", "bucket_view", "gradients as bucket views", "check", true],
    ["layout", "reshard", "ZeRO-3 frees weights after forward", "check", true],
  ];
  const LABELS = Object.fromEntries(FIELDS.map((f) => [f[1], f[2]]));
  const DEFAULTS = Object.fromEntries(FIELDS.map((f) => [f[1], f[4]]));
  // [legend, groups, folded: [summary, group]]
  const GROUP_ORDER = [
    ["Model and batch", ["model", "run", "policy"],
      ["Experts and context parallelism (chapter 12)", "moe"]],
    ["GPUs", ["hardware"], ["The GPU's figures (datasheet, fitted)", "sheet"]],
    ["Layout", ["layout"], null],
  ];
  const SHEET_KEYS = FIELDS.filter((f) => f[0] === "sheet").map((f) => f[1])
    .concat(["memory_mib", "gpus_per_node"]);

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }

  function field([group, key, label, kind, value, options]) {
    const id = `dc-plan-${key}`;
    let input;
    if (kind === "select") {
      input = el("select", { id, name: key, "data-group": group });
      for (const [v, text] of options) input.append(el("option", { value: v }, text));
      input.value = String(value);
    } else if (kind === "check") {
      input = el("input", { id, name: key, type: "checkbox", "data-group": group });
      input.checked = value;
    } else {
      input = el("input", {
        id, name: key, type: "number", "data-group": group, "data-kind": kind,
        step: kind === "int" ? "1" : "any",
        min: kind === "int" && key !== "experts" ? "1" : "0",
        inputmode: kind === "int" ? "numeric" : "decimal", value: String(value),
      });
    }
    const row = el("div", { class: "dc-plan-field dc-plan-" + kind },
      el("label", { for: id }, label));
    if (key === "dp") { // dp follows the GPUs until the reader pins it
      const pin = el("input", { type: "checkbox", name: "dp_pinned", id: "dc-plan-dp_pinned" });
      row.append(el("label", {
        class: "dc-plan-pin", for: "dc-plan-dp_pinned",
        title: "pinned: dp stays as typed; unpinned: dp = GPUs / (tp x pp x ep x cp)",
      }, pin, "pin"));
    }
    row.append(input);
    return row;
  }

  function buildForm(root) {
    const form = el("form", { class: "dc-plan-inputs", autocomplete: "off" });
    for (const [legend, groups, folded] of GROUP_ORDER) {
      const set = el("fieldset", {}, el("legend", {}, legend));
      for (const f of FIELDS) if (groups.includes(f[0])) set.append(field(f));
      if (folded) {
        const more = el("details", { class: "dc-plan-more" }, el("summary", {}, folded[0]));
        for (const f of FIELDS) if (f[0] === folded[1]) more.append(field(f));
        set.append(more);
      }
      if (groups.includes("layout")) {
        set.append(el("button", { type: "button", class: "dc-plan-find" },
          "Find the fastest layout that fits"));
      }
      form.append(set);
    }
    form.addEventListener("submit", (e) => e.preventDefault());
    root.append(form);
    return form;
  }

  /** What the reader typed, as Python would get it: an integer (BigInt), a
      float, or the text itself (which the checks then refuse by name). */
  function parse(text, kind) {
    const t = text.trim();
    if (kind === "int" && /^[+-]?\d+$/.test(t)) return BigInt(t);
    if (t !== "" && Number.isFinite(Number(t))) return Number(t);
    return t;
  }

  /** A number field the browser could not read (letters) or left empty, in
      plain words; null if every number field holds a number. */
  function unreadable(form) {
    for (const e of form.elements) {
      if (!e.dataset || !e.dataset.kind) continue;
      const what = e.dataset.kind === "int" ? "a whole number" : "a number";
      const example = `e.g. ${DEFAULTS[e.name]}`;
      if (e.validity && e.validity.badInput) {
        return `"${LABELS[e.name]}" holds something that is not a number: ` +
          `type ${what} (${example}).`;
      }
      if (e.value.trim() === "") return `"${LABELS[e.name]}" is empty: type ${what} (${example}).`;
    }
    return null;
  }

  /** The form's values, by name: BigInt, number, string or boolean. */
  function values(form) {
    const v = {};
    for (const e of form.elements) {
      if (!e.name) continue;
      if (e.type === "checkbox") v[e.name] = e.checked;
      else if (e.tagName === "SELECT") v[e.name] = e.value;
      else v[e.name] = parse(e.value, e.dataset.kind);
    }
    return v;
  }

  /** predict's data and the GPU count from the form's values. */
  function inputs(v) {
    const P = window.dcPlan;
    const preset = P.GPUS[v.gpu];
    const hardware = P.fromSheet(preset.name, preset.source, preset.arch, v);
    const layout = {};
    for (const k of LAYOUT_KEYS) layout[k] = v[k];
    layout.zero = BigInt(v.zero);
    const model = {};
    for (const k of MODEL_KEYS.concat(MOE_KEYS)) model[k] = v[k];
    return {
      data: {
        model, batch: v.batch, layout, hardware,
        policy: { dtype: v.dtype, reduce: v.reduce, optimizer: v.optimizer },
      },
      gpus: v.gpus,
    };
  }

  /** dp = GPUs / (tp x pp x ep x cp), where that divides; else dp is left. */
  function deriveDp(form) {
    if (form.elements.dp_pinned.checked) return;
    const v = values(form);
    if (!SHARE_KEYS.every((k) => typeof v[k] === "bigint" && v[k] >= 1n)) return;
    const rest = v.tp * v.pp * v.ep * v.cp;
    if (v.gpus % rest === 0n) form.elements.dp.value = String(v.gpus / rest);
  }

  /* ---- the outputs ---- */

  function gib(bytes) {
    return (Number(bytes) / GIB).toFixed(Number(bytes) < 10 * GIB ? 2 : 1);
  }

  function seconds(s) {
    return s < 1 ? (s * 1e3).toPrecision(3) + " ms" : s.toPrecision(3) + " s";
  }

  /** An element showing `text` that carries the exact number for the test. */
  function out(tag, key, value, text, attrs) {
    const shown = typeof value === "number" ? String(value) : value.toString();
    const e = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    e.setAttribute("data-key", key);
    e.setAttribute("data-value", shown);
    if (text !== null) e.append(text);
    return e;
  }

  Object.assign(window, { dcPlannerParts: { el, out, gib, seconds } });

  function render(view, p) {
    const D = window.dcPlannerDraw;
    view.summary.replaceChildren(...D.summary(p));
    view.memory.replaceChildren(D.memoryChart(p, view.memory.clientWidth));
    view.time.replaceChildren(D.timeChart(p, view.time.clientWidth));
    view.memory.querySelectorAll("svg").forEach(D.keepInside);
    view.time.querySelectorAll("svg").forEach(D.keepInside);
    view.table.replaceChildren(...D.tables(p));
  }

  function fail(view, prefix, message) {
    view.error.replaceChildren(prefix, out("span", "error", message, message));
    view.error.hidden = false;
    view.outputs.classList.add("dc-plan-stale");
    view.state.p = null;
  }

  function update(form, view) {
    const bad = unreadable(form);
    if (bad) return fail(view, "Check the form: ", bad);
    let p, read;
    try {
      read = inputs(values(form));
      p = window.dcPlan.predict(read.data, read.gpus);
    } catch (err) {
      return fail(view, "Impossible: ", err.message);
    }
    view.error.hidden = true;
    view.error.replaceChildren();
    view.outputs.classList.remove("dc-plan-stale");
    view.state.p = p;
    view.state.read = read;
    render(view, p);
    window.dcPlannerMore.refresh(view);
  }

  function onInput(form, view, event) {
    const name = event && event.target && event.target.name;
    if (name === "preset" && form.elements.preset.value !== "custom") {
      const shape = MODELS[form.elements.preset.value][1];
      MODEL_KEYS.forEach((k, i) => (form.elements[k].value = String(shape[i])));
    } else if (MODEL_KEYS.includes(name)) {
      form.elements.preset.value = "custom";
    } else if (name === "gpu") {
      const sheet = window.dcPlan.SHEETS[form.elements.gpu.value];
      for (const k of SHEET_KEYS) form.elements[k].value = String(sheet[k]);
    } else if (name === "dp") {
      form.elements.dp_pinned.checked = true;
    }
    if (SHARE_KEYS.includes(name) || name === "dp_pinned") deriveDp(form);
    if (name !== "sweep") window.dcPlannerMore.inputChanged(view);
    update(form, view);
  }

  /** Set the form's layout fields to `layout` (a predict's layout dict). */
  function useLayout(form, view, layout) {
    for (const k of ["dp", "tp", "pp", "micro_batches", "schedule", "virtual", "ckpt"]) {
      form.elements[k].value = String(layout[k]);
    }
    form.elements.zero.value = String(layout.zero);
    for (const k of ["sp", "bucket_view", "reshard"]) form.elements[k].checked = layout[k];
    update(form, view);
  }

  /** Every field's value, to restore later (a kept layout B). */
  function snapshot(form) {
    const s = {};
    for (const e of form.elements) {
      if (e.name) s[e.name] = e.type === "checkbox" ? e.checked : e.value;
    }
    return s;
  }

  function restore(form, view, s) {
    for (const e of form.elements) {
      if (!(e.name in s)) continue;
      if (e.type === "checkbox") e.checked = s[e.name];
      else e.value = s[e.name];
    }
    update(form, view);
  }

  function start() {
    const root = document.getElementById("dc-planner");
    if (!root || !window.dcPlan || !window.dcPlannerDraw || !window.dcPlannerMore) return;
    root.replaceChildren();
    const form = buildForm(root);
    const view = {
      form,
      state: { p: null, read: null, search: null, kept: null },
      error: el("p", { class: "dc-plan-error", role: "alert" }),
      summary: el("p", { class: "dc-plan-summary" }),
      memory: el("div", { class: "dc-plan-chart dc-plan-memory" }),
      time: el("div", { class: "dc-plan-chart dc-plan-time" }),
      table: el("div", { class: "dc-plan-tables" }),
    };
    view.error.hidden = true;
    window.dcPlannerState = view.state; // the search's whole list, for the test
    const charts = el("div", { class: "dc-plan-charts" },
      el("div", {}, el("h4", {}, "Memory per GPU at its peak, by pipeline rank"), view.memory),
      el("div", {}, el("h4", {}, "One step of the busiest GPU"), view.time));
    view.outputs = el("div", { class: "dc-plan-outputs", "aria-live": "polite" },
      view.summary, charts);
    root.append(view.error, view.outputs);
    window.dcPlannerMore.build(root, view, {
      useLayout: (layout) => useLayout(form, view, layout),
      snapshot: () => snapshot(form),
      restore: (s) => restore(form, view, s),
      values: () => inputs(values(form)),
    });
    view.outputs.append(view.table);
    const handler = (e) => onInput(form, view, e);
    form.addEventListener("input", handler);
    form.addEventListener("change", handler);
    deriveDp(form);
    update(form, view);
    let width = root.clientWidth;
    window.addEventListener("resize", () => {
      if (root.clientWidth !== width && view.state.p) {
        width = root.clientWidth;
        update(form, view);
      }
    });
  }

  window.dcPlannerStart = start;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
