/* distcourse.plan in JavaScript, for the planner page (book/10b_planner_page.md):
   spec.js (this file) holds the inputs and the checks; dtypes.js, hardware.js,
   memory.js, work.js, timing.js, predict.js and search.js the rest, one file per
   module of the package.

   A line-by-line port of the Python package's formulas (distcourse/plan: spec.py,
   checks.py, axes.py, hardware.py, memory.py, work.py, timing.py, predict.py, and
   comm/ledger.py's ring_wire_bytes, parallel/hybrid's parameters_held and links,
   parallel/tensor's block_activation_bytes and dtypes.py, distcourse/sdpa.py's
   kernel choice and what each kernel keeps): the same names, the same order of
   operations, the same error messages. The Python is the source of truth; the browser test
   (tests/test_book_browser_planner.py) sets this page's inputs on a grid of layouts
   and holds every number equal to `distcourse.plan.predict(...).to_dict()`: bytes
   exactly, seconds to a relative 1e-9.

   Integers are BigInt here, as Python's int: byte and FLOP counts of a 70B model
   pass 2^53, where a float would drop the last digits; `//` of non-negative
   integers is BigInt's `/`. Seconds are floats, computed in Python's order.
   Loaded on every page of the book (jupyter-book includes every script in
   _static); the files only fill window.dcPlan, and call each other through it at
   run time, so their order of loading does not matter. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});

  const KINDS = [
    "parameters", "gradients", "optimizer", "activations", "loss", "temporaries",
    "buffers", "workspace",
  ];
  const MOMENTS = ["loss", "backward", "step"];
  const DTYPES = ["fp32", "bf16", "amp-bf16"];
  const REDUCES = ["fp32", "bf16"];
  const OPTIMIZERS = ["adamw", "adamw-fused", "sgd"];
  const CKPT = ["none", "selective", "full"];
  const SCHEDULES = ["gpipe", "1f1b", "interleaved"];

  /** Python's repr of a float: the same shortest digits as JavaScript's, written
      1e-05 / 1e+16 where Python switches to an exponent (below 1e-4, from 1e16). */
  function floatRepr(x) {
    if (Number.isNaN(x)) return "nan";
    if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
    const [digits, exp] = x.toExponential().split("e");
    const e = Number(exp);
    if (e < -4 || e >= 16) {
      return `${digits}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
    }
    return Number.isInteger(x) ? x.toFixed(0) + ".0" : String(x);
  }

  /** Python's repr of what the reader typed: 3, 1.5, 'abc', None. */
  function repr(value) {
    if (value === null || value === undefined) return "None";
    if (typeof value === "boolean") return value ? "True" : "False";
    if (typeof value === "bigint") return value.toString();
    if (typeof value === "number") return floatRepr(value);
    return "'" + String(value) + "'";
  }

  function count(value, name, least = 1n) {
    if (typeof value !== "bigint" || value < least) {
      throw new Error(`${name} must be an integer >= ${least}, got ${repr(value)}`);
    }
    return value;
  }

  function choice(value, name, allowed) {
    if (!allowed.includes(value)) {
      throw new Error(`${name} must be one of ${allowed.join(", ")}, got ${repr(value)}`);
    }
    return value;
  }

  /** spec.ModelSpec: layers, hidden, heads, seq, vocab, top_k, experts (BigInt),
      capacity_factor (a number); the MoE keys default to a dense model. */
  function modelSpec(d) {
    const m = {};
    const given = { experts: 0n, top_k: 1n, capacity_factor: 1.25, ...d };
    for (const name of ["layers", "hidden", "heads", "seq", "vocab", "top_k"]) {
      m[name] = count(given[name], name);
    }
    m.experts = count(given.experts, "experts", 0n);
    const f = given.capacity_factor;
    if (!(typeof f === "number" || typeof f === "bigint") || !(Number(f) > 0)) {
      throw new Error(`capacity_factor must be a number > 0, got ${repr(f)}`);
    }
    m.capacity_factor = Number(f);
    if (m.experts && m.top_k > m.experts) {
      throw new Error(`top_k=${m.top_k} is more than experts=${m.experts}`);
    }
    if (m.hidden % m.heads) {
      throw new Error(`hidden=${m.hidden} is not divisible by heads=${m.heads}`);
    }
    return m;
  }

  /** spec.ModelSpec.params: L (12 h^2 + 13 h) + 2 V h + seq h + 2 h (+ experts). */
  function params(m) {
    const L = m.layers, h = m.hidden, E = m.experts;
    const dense = L * (12n * h * h + 13n * h) + 2n * m.vocab * h + m.seq * h + 2n * h;
    return dense + (E ? L * ((E - 1n) * (8n * h * h + 5n * h) + h * E) : 0n);
  }

  /** spec.DTypePolicy and its bytes per element. */
  function dtypePolicy(d) {
    const p = {
      dtype: choice(d.dtype, "dtype", DTYPES),
      reduce: choice(d.reduce, "reduce", REDUCES),
      optimizer: choice(d.optimizer, "optimizer", OPTIMIZERS),
    };
    p.weight_bytes = p.dtype === "bf16" ? 2n : 4n;
    p.grad_bytes = p.weight_bytes;
    p.reduce_bytes = p.reduce === "fp32" ? 4n : 2n;
    p.adam = p.optimizer !== "sgd";
    p.optimizer_bytes = (p.adam ? 8n : 0n) + (p.dtype === "bf16" ? 4n : 0n);
    p.step_bytes = p.adam ? 4n : 0n;
    p.matmul_dtype = p.dtype === "fp32" ? "fp32" : "bf16";
    return p;
  }

  /** spec.PlanLayout: degrees and how each rank runs its part. */
  function planLayout(d) {
    const L = {};
    const given = { ep: 1n, cp: 1n, ...d };
    for (const name of ["dp", "tp", "pp", "micro_batches", "virtual", "ep", "cp"]) {
      L[name] = count(given[name], name);
    }
    if (typeof d.zero !== "bigint" || d.zero < 0n || d.zero > 3n) {
      throw new Error(`zero (the ZeRO stage) must be 0, 1, 2 or 3, got ${repr(d.zero)}`);
    }
    L.zero = d.zero;
    for (const name of ["sp", "bucket_view", "reshard"]) {
      const value = name === "reshard" ? (d.reshard ?? true) : d[name];
      if (typeof value !== "boolean") {
        throw new Error(`${name} must be true or false, got ${repr(value)}`);
      }
      L[name] = value;
    }
    L.ckpt = choice(d.ckpt, "ckpt", CKPT);
    L.schedule = choice(d.schedule, "schedule", SCHEDULES);
    L.gpus = L.dp * L.tp * L.pp * L.ep * L.cp;
    L.shares = L.dp * L.ep;
    return L;
  }

  /** checks.check: an Error naming the constraint an impossible layout breaks. */
  function check(model, batch, L, gpus) {
    count(batch, "batch");
    if (gpus !== null && gpus !== undefined && L.gpus !== gpus) {
      const extra = L.ep * L.cp > 1n ? ` x ep=${L.ep} x cp=${L.cp}` : "";
      throw new Error(
        `dp=${L.dp} x tp=${L.tp} x pp=${L.pp}${extra} = ${L.gpus} GPUs, ` +
          `but there are ${gpus}`
      );
    }
    if (!L.reshard && L.zero !== 3n) {
      throw new Error(
        "reshard=False (FSDP's reshard_after_forward=False) needs zero=3, " +
          `got zero=${L.zero}`
      );
    }
    if (L.ep > 1n && !model.experts) {
      throw new Error(`expert parallelism ep=${L.ep} needs experts > 0`);
    }
    if (model.experts % L.ep) {
      throw new Error(`experts=${model.experts} do not divide into ep=${L.ep} equal groups`);
    }
    if (L.cp > 1n && model.seq % (2n * L.cp)) {
      throw new Error(
        `context parallel: seq=${model.seq} does not split into 2 x cp=` +
          `${2n * L.cp} zig-zag chunks`
      );
    }
    for (const name of ["heads", "hidden", "vocab"]) {
      if (model[name] % L.tp) {
        throw new Error(`${name}=${model[name]} is not divisible by tp=${L.tp}`);
      }
    }
    if (L.sp && (model.seq / L.cp) % L.tp) {
      const part = L.cp > 1n ? ` / cp=${L.cp}` : "";
      throw new Error(
        `sequence parallel: seq=${model.seq}${part} is not divisible by tp=${L.tp}`
      );
    }
    if (L.sp && L.tp === 1n) throw new Error("sequence parallel (sp) needs tp > 1");
    const stages = L.pp * L.virtual;
    if (stages > model.layers) {
      throw new Error(
        `pp=${L.pp} x virtual=${L.virtual} = ${stages} stages, ` +
          `more than layers=${model.layers}`
      );
    }
    if (model.layers % stages) {
      throw new Error(
        `layers=${model.layers} do not divide into ${stages} equal stages ` +
          `(pp=${L.pp} x virtual=${L.virtual})`
      );
    }
    if (L.schedule === "interleaved" && L.virtual < 2n) {
      throw new Error("the interleaved schedule needs virtual >= 2 stages per rank");
    }
    if (L.schedule !== "interleaved" && L.virtual > 1n) {
      throw new Error(`virtual=${L.virtual} stages per rank needs schedule=interleaved`);
    }
    if (L.schedule === "interleaved" && L.pp === 1n) {
      throw new Error("the interleaved schedule needs a pipeline: pp=1");
    }
    const perRound = L.micro_batches / L.pp;
    const rounds = perRound > 1n ? perRound : 1n;
    if (L.schedule === "interleaved" && L.micro_batches % rounds) {
      throw new Error(
        `interleaved 1F1B runs micro-batches in m // pp = ${rounds} equal rounds:` +
          ` micro_batches=${L.micro_batches} does not split into ${rounds}`
      );
    }
    if (L.pp > 1n && L.schedule !== "gpipe" && L.micro_batches < L.pp) {
      throw new Error(
        `${L.schedule} needs micro_batches >= pp: ${L.micro_batches} < pp=${L.pp}`
      );
    }
    const d = L.ep === 1n ? `dp=${L.dp}` : `dp x ep=${L.shares}`;
    if (batch % L.shares) {
      throw new Error(`batch=${batch} does not split into ${d} equal shares`);
    }
    if ((batch / L.shares) % L.micro_batches) {
      throw new Error(
        `a share of ${batch / L.shares} (batch ${batch} / ${d}) does not split ` +
          `into micro_batches=${L.micro_batches}`
      );
    }
  }

  Object.assign(P, {
    KINDS, MOMENTS, DTYPES, REDUCES, OPTIMIZERS, CKPT, SCHEDULES,
    floatRepr, repr, count, choice, modelSpec, params, dtypePolicy, planLayout, check,
  });
})();
