/* The interactive planner of book/10b_planner_page.md: a form of inputs (the key
   names of distcourse.plan's to_dict), and on every keystroke the prediction of
   _static/plan/*.js drawn as memory per pipeline rank stacked by kind and seconds
   per step by part. Runs only on a page with <div id="dc-planner">; nothing is
   fetched. Every number shown carries its exact value in data-key / data-value
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

  /* ---- the form ---- */

  // [group, key, label, kind, default, options]: kind int, float, select, check.
  const FIELDS = [
    ["model", "preset", "model", "select", "7b",
      Object.entries(MODELS).map(([k, v]) => [k, v[0]]).concat([["custom", "custom"]])],
    ["model", "layers", "layers (blocks)", "int", 32],
    ["model", "hidden", "hidden size", "int", 4096],
    ["model", "heads", "attention heads", "int", 32],
    ["model", "seq", "sequence (tokens)", "int", 4096],
    ["model", "vocab", "vocabulary", "int", 32000],
    ["model", "experts", "experts a block (0: dense)", "int", 0],
    ["model", "top_k", "experts a token (top-k)", "int", 1],
    ["model", "capacity_factor", "expert capacity factor", "float", 1.25],
    ["run", "batch", "global batch (sequences)", "int", 256],
    ["policy", "dtype", "dtype policy", "select", "bf16",
      [["fp32", "fp32"], ["bf16", "bf16 weights, fp32 master"],
        ["amp-bf16", "fp32 weights, bf16 autocast"]]],
    ["policy", "reduce", "gradients reduced in", "select", "bf16",
      [["fp32", "fp32"], ["bf16", "bf16"]]],
    ["policy", "optimizer", "optimizer", "select", "adamw",
      [["adamw", "AdamW (foreach)"], ["adamw-fused", "AdamW (fused)"], ["sgd", "SGD"]]],
    ["hardware", "gpu", "GPU", "select", "h100",
      [["h100", "H100 SXM"], ["h200", "H200 SXM"], ["a100", "A100 SXM"]]],
    ["run", "gpus", "GPUs", "int", 64],
    ["hardware", "gpus_per_node", "GPUs per node", "int", 8],
    ["hardware", "memory_mib", "memory (MiB, as nvidia-smi)", "float", 81559],
    ["hardware", "tflops_bf16", "peak TFLOP/s, bf16", "float", 989.5],
    ["hardware", "efficiency_bf16", "share of bf16 peak reached", "float", 0.65],
    ["hardware", "tflops_fp32", "peak TFLOP/s, fp32", "float", 67],
    ["hardware", "efficiency_fp32", "share of fp32 peak reached", "float", 0.8],
    ["hardware", "bandwidth_tbs", "memory bandwidth (TB/s)", "float", 3.35],
    ["hardware", "efficiency_memory", "share of bandwidth reached", "float", 0.8],
    ["hardware", "workspace_mib", "cuBLAS workspace (MiB)", "float", 64],
    ["hardware", "context_mib", "CUDA context (MiB)", "float", 512],
    ["hardware", "nccl_mib", "NCCL buffers a group (MiB)", "float", 512],
    ["hardware", "node_gbs", "in-node GB/s (one way)", "float", 450],
    ["hardware", "network_gbs", "network GB/s", "float", 50],
    ["hardware", "alpha_node_us", "in-node latency (µs)", "float", 5],
    ["hardware", "alpha_network_us", "network latency (µs)", "float", 10],
    ["layout", "dp", "data parallel dp", "int", 16],
    ["layout", "tp", "tensor parallel tp", "int", 2],
    ["layout", "pp", "pipeline stages pp", "int", 2],
    ["layout", "micro_batches", "micro-batches m", "int", 8],
    ["layout", "ep", "expert parallel ep", "int", 1],
    ["layout", "cp", "context parallel cp", "int", 1],
    ["layout", "schedule", "schedule", "select", "1f1b",
      [["1f1b", "1F1B"], ["gpipe", "GPipe"], ["interleaved", "interleaved"]]],
    ["layout", "virtual", "stages per rank (interleaved)", "int", 1],
    ["layout", "zero", "ZeRO stage", "select", "0",
      [["0", "0 (none)"], ["1", "1"], ["2", "2"], ["3", "3"]]],
    ["layout", "ckpt", "activation checkpointing", "select", "none",
      [["none", "none"], ["selective", "selective"], ["full", "full"]]],
    ["layout", "sp", "sequence parallel", "check", true],
    ["layout", "bucket_view", "gradients as bucket views", "check", true],
  ];
  const GROUP_ORDER = [
    ["Model and batch", ["model:*", "run:batch", "policy:*"]],
    ["GPUs", ["hardware:gpu", "run:gpus", "hardware:*"]],
    ["Layout", ["layout:*"]],
  ];
  const SHEET_KEYS = ["tflops_fp32", "tflops_bf16", "efficiency_fp32",
    "efficiency_bf16", "bandwidth_tbs", "efficiency_memory", "memory_mib",
    "workspace_mib", "context_mib", "nccl_mib", "node_gbs", "network_gbs",
    "alpha_node_us", "alpha_network_us", "gpus_per_node"];

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
    return el("div", { class: "dc-plan-field dc-plan-" + kind }, el("label", { for: id }, label), input);
  }

  function buildForm(root) {
    const form = el("form", { class: "dc-plan-inputs", autocomplete: "off" });
    for (const [legend, patterns] of GROUP_ORDER) {
      const set = el("fieldset", {}, el("legend", {}, legend));
      const taken = new Set();
      for (const pattern of patterns) {
        const [group, key] = pattern.split(":");
        for (const f of FIELDS) {
          if (f[0] === group && (key === "*" || f[1] === key) && !taken.has(f[1])) {
            taken.add(f[1]);
            set.append(field(f));
          }
        }
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

  function readInputs(form) {
    const P = window.dcPlan;
    const v = {};
    for (const e of form.elements) {
      if (!e.name) continue;
      if (e.type === "checkbox") v[e.name] = e.checked;
      else if (e.tagName === "SELECT") v[e.name] = e.value;
      else v[e.name] = parse(e.value, e.dataset.kind);
    }
    const preset = P.GPUS[v.gpu];
    const hardware = P.fromSheet(preset.name, preset.source, preset.arch, v);
    const layout = {};
    for (const k of ["dp", "tp", "pp", "micro_batches", "sp", "ckpt", "schedule",
      "virtual", "bucket_view", "ep", "cp"]) layout[k] = v[k];
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
    view.memory.replaceChildren(D.memoryChart(p));
    view.time.replaceChildren(D.timeChart(p));
    view.table.replaceChildren(...D.tables(p));
  }

  function update(form, view) {
    let p;
    try {
      const { data, gpus } = readInputs(form);
      if (typeof gpus !== "bigint") window.dcPlan.count(gpus, "gpus"); // a blank field
      p = window.dcPlan.predict(data, gpus);
    } catch (err) {
      view.error.replaceChildren(
        "Impossible: ",
        out("span", "error", err.message, err.message)
      );
      view.error.hidden = false;
      view.outputs.classList.add("dc-plan-stale");
      return;
    }
    view.error.hidden = true;
    view.error.replaceChildren();
    view.outputs.classList.remove("dc-plan-stale");
    render(view, p);
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
    }
    update(form, view);
  }

  function start() {
    const root = document.getElementById("dc-planner");
    if (!root || !window.dcPlan || !window.dcPlannerDraw) return;
    root.replaceChildren();
    const form = buildForm(root);
    const view = {
      error: el("p", { class: "dc-plan-error", role: "alert" }),
      summary: el("p", { class: "dc-plan-summary" }),
      memory: el("div", { class: "dc-plan-chart" }),
      time: el("div", { class: "dc-plan-chart" }),
      table: el("div", { class: "dc-plan-tables" }),
    };
    view.error.hidden = true;
    view.outputs = el("div", { class: "dc-plan-outputs", "aria-live": "polite" },
      view.summary, el("h4", {}, "Memory per GPU, by pipeline rank"), view.memory,
      el("h4", {}, "Time per step"), view.time, view.table);
    root.append(view.error, view.outputs);
    const handler = (e) => onInput(form, view, e);
    form.addEventListener("input", handler);
    form.addEventListener("change", handler);
    update(form, view);
  }

  window.dcPlannerStart = start;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
