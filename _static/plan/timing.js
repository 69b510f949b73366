/* distcourse/plan/timing.py in JavaScript: seconds of one training step (see
   spec.js for how the port is held equal to the Python, and timing.py's docstring
   for every formula). Counts are BigInt; seconds are floats, in Python's order. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const AXES = ["tp", "pp", "dp"];
  // ZeRO stage -> [op, which bytes, once a "step" or every "micro"-batch]
  const DP_COLLECTIVES = {
    0: [["all_reduce", "grad", "step"]],
    1: [["reduce_scatter", "grad", "step"], ["all_gather", "weight", "step"]],
    2: [["reduce_scatter", "grad", "micro"], ["all_gather", "weight", "step"]],
    3: [
      ["all_gather", "weight", "micro"],
      ["all_gather", "weight", "micro"],
      ["reduce_scatter", "grad", "micro"],
    ],
  };
  const KEPT = [["all_gather", "weight", "micro"], ["reduce_scatter", "grad", "micro"]];
  const ALPHA_STEPS = { all_reduce: 2n, all_gather: 1n, reduce_scatter: 1n };
  const RING_SHARE = {
    all_reduce: (n) => 2n * (n - 1n),
    all_gather: (n) => (n - 1n) * n,
    reduce_scatter: (n) => n - 1n,
    all_to_all: (n) => n - 1n,
  };

  /** comm.ledger.ring_wire_bytes for the collectives the plan uses. */
  function ringWireBytes(op, handedIn, n) {
    if (n <= 1n) return 0n;
    return (handedIn * RING_SHARE[op](n)) / n;
  }

  /** Bytes a rank hands to a data-parallel collective over P = `total` elements,
      q = ceil(P / d) its (padded) share: all-reduce P, reduce-scatter d q,
      all-gather q. */
  function handedIn(op, what, policy, total, d) {
    const per = what === "grad" ? policy.reduce_bytes : policy.weight_bytes;
    const share = P.ceilDiv(total, d);
    return per * ({ all_reduce: total, reduce_scatter: d * share }[op] ?? share);
  }

  /** [op, which bytes, times in a step] of the layout's ZeRO stage: "micro" ones
      m times; ZeRO-3 without reshard, KEPT. */
  function dpCalls(layout) {
    const kept = layout.zero === 3n && !layout.reshard;
    const chosen = kept ? KEPT : DP_COLLECTIVES[layout.zero];
    const m = layout.micro_batches;
    return chosen.map(([op, what, when]) => [op, what, when === "micro" ? m : 1n]);
  }

  function stageFlops(model, b, layout, stage) {
    const stages = layout.pp * layout.virtual;
    const n = (b * model.seq) / layout.cp, s = model.seq, h = model.hidden;
    const blocks = model.layers / stages;
    const block = n * (24n * h * h + 4n * s * h) + P.moeFlopsDelta(model, n);
    let forward = blocks * block;
    if (stage === stages - 1n) forward += 2n * n * h * model.vocab;
    const recompute = {
      none: 0n,
      selective: blocks * 4n * n * s * h,
    }[layout.ckpt] ?? blocks * block;
    return 3n * forward + recompute;
  }

  /** tp, pp, dp, and cp, ep where their degree is above 1. */
  function layoutAxes(layout) {
    return AXES.concat(["cp", "ep"].filter((a) => layout[a] > 1n));
  }

  /** 'node', 'network' or '-' (degree 1) per axis: grid (dp, pp, ep, cp, tp). */
  function axisLinks(layout, hw) {
    const gpus = BigInt(hw.gpus_per_node);
    let span = 1n;
    const where = {};
    for (const axis of ["tp", "cp", "ep", "pp", "dp"]) {
      span *= layout[axis];
      const link = span <= gpus ? "node" : "network";
      where[axis] = layout[axis] > 1n ? link : "-";
    }
    const out = {};
    for (const axis of layoutAxes(layout)) out[axis] = where[axis];
    return out;
  }

  /** Per axis: [wire bytes, alpha steps] pipeline rank `rank` sends in a step. */
  function rankMessages(model, batch, policy, layout, rank) {
    const stages = layout.pp * layout.virtual, t = layout.tp, m = layout.micro_batches;
    const b = batch / (layout.shares * m);
    const n = (b * model.seq) / layout.cp, e = policy.activation_bytes;
    const A = n * model.hidden * e;
    let tp = 0n, pp = 0n, tpSteps = 0n, ppSteps = 0n;
    const out = {};
    for (const a of layoutAxes(layout)) out[a] = [0n, 0n];
    const layer = P.layerMessages(model, layout, n, e);
    for (const k of P.rankStages(layout, rank)) {
      for (const [axis, [nbytes, steps]] of Object.entries(layer)) {
        const times = (m * model.layers) / stages;
        out[axis] = [out[axis][0] + times * nbytes, out[axis][1] + times * steps];
      }
      const first = k === 0n ? 1n : 0n, last = k === stages - 1n ? 1n : 0n;
      const calls = (4n * model.layers) / stages + first + last;
      tp += m * calls * ringWireBytes("all_reduce", A, t);
      tp += m * 3n * last * ringWireBytes("all_reduce", 4n * n, t);
      tpSteps += m * (calls + 3n * last) * 2n * (t - 1n);
      const sends = layout.pp > 1n ? (1n - last) + (1n - first) : 0n;
      pp += m * sends * A;
      ppSteps += m * sends;
    }
    let dp = 0n, dpSteps = 0n;
    for (const [d, [total]] of P.rankGroups(model, layout, rank)) {
      for (const [op, what, times] of dpCalls(layout)) {
        const nbytes = ringWireBytes(op, handedIn(op, what, policy, total, d), d);
        dp += times * nbytes;
        dpSteps += times * ALPHA_STEPS[op] * (d - 1n);
      }
    }
    Object.assign(out, { tp: [tp, tpSteps], pp: [pp, ppSteps], dp: [dp, dpSteps] });
    return out;
  }

  /** [seconds by part with 'total', wire bytes per axis, FLOPs] of the busiest rank. */
  function stepTime(model, batch, policy, layout, hw) {
    const t = layout.tp, p = layout.pp, m = layout.micro_batches;
    const b = batch / (layout.shares * m);
    const rate = P.rate(hw, policy.dtype);
    const perRank = [];
    for (let r = 0n; r < p; r++) {
      let flops = 0n;
      for (const k of P.rankStages(layout, r)) flops += stageFlops(model, b, layout, k);
      perRank.push(flops / t);
    }
    const busiest = P.max(perRank);
    const unit = Number(busiest) / rate;
    const seconds = {
      compute: Number(m) * unit,
      bubble: (Number(p - 1n) / Number(layout.virtual)) * unit,
    };
    const where = axisLinks(layout, hw);
    const wire = {};
    const messages = [];
    for (let r = 0n; r < p; r++) messages.push(rankMessages(model, batch, policy, layout, r));
    const axes = layoutAxes(layout);
    for (const axis of axes) {
      const [alpha, beta] = P.link(hw, where[axis]);
      let worst = 0.0;
      wire[axis] = 0n;
      for (const sent of messages) {
        const [nbytes, steps] = sent[axis];
        worst = Math.max(worst, Number(steps) * alpha + Number(nbytes) * beta);
        if (nbytes > wire[axis]) wire[axis] = nbytes;
      }
      seconds[axis] = worst;
    }
    let total = 0;
    for (const part of ["compute", "bubble", ...axes]) total += seconds[part];
    seconds.total = total;
    return [seconds, wire, m * busiest];
  }

  Object.assign(P, {
    AXES, ringWireBytes, handedIn, dpCalls, stageFlops, layoutAxes, axisLinks,
    rankMessages, stepTime,
  });
})();
