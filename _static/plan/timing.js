/* distcourse/plan/timing.py in JavaScript: seconds of one training step (see
   spec.js for how the port is held equal to the Python, and timing.py's docstring
   for every formula). Counts are BigInt; seconds are floats, in Python's order. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const AXES = ["tp", "pp", "dp"];
  const DP_COLLECTIVES = {
    0: [["all_reduce", "grad"]],
    1: [["all_reduce", "grad"], ["all_gather", "weight"]],
    2: [["reduce_scatter", "grad"], ["all_gather", "weight"]],
    3: [["all_gather", "weight"], ["all_gather", "weight"], ["reduce_scatter", "grad"]],
  };
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

  function stageFlops(model, b, layout, stage) {
    const stages = layout.pp * layout.virtual;
    const n = b * model.seq, s = model.seq, h = model.hidden;
    const blocks = model.layers / stages;
    let forward = blocks * n * (24n * h * h + 4n * s * h);
    if (stage === stages - 1n) forward += 2n * n * h * model.vocab;
    const recompute = {
      none: 0n,
      selective: blocks * 4n * n * s * h,
    }[layout.ckpt] ?? blocks * n * (24n * h * h + 4n * s * h);
    return 3n * forward + recompute;
  }

  /** parallel.hybrid.recipe.links: 'node', 'network' or '-' (degree 1) per axis. */
  function axisLinks(layout, hw) {
    const gpus = BigInt(hw.gpus_per_node), tp = layout.tp, pp = layout.pp;
    const where = {
      dp: layout.dp * pp * tp <= gpus ? "node" : "network",
      pp: tp * pp <= gpus ? "node" : "network",
      tp: tp <= gpus ? "node" : "network",
    };
    const degree = { dp: layout.dp, pp: pp, tp: tp };
    const out = {};
    for (const axis of ["dp", "pp", "tp"]) out[axis] = degree[axis] > 1n ? where[axis] : "-";
    return out;
  }

  /** Per axis: [wire bytes, alpha steps] pipeline rank `rank` sends in a step. */
  function rankMessages(model, batch, policy, layout, rank) {
    const stages = layout.pp * layout.virtual, t = layout.tp, m = layout.micro_batches;
    const b = batch / (layout.dp * m);
    const n = b * model.seq;
    const A = n * model.hidden * policy.activation_bytes;
    let tp = 0n, pp = 0n, tpSteps = 0n, ppSteps = 0n;
    for (const k of P.rankStages(layout, rank)) {
      const first = k === 0n ? 1n : 0n, last = k === stages - 1n ? 1n : 0n;
      const calls = (4n * model.layers) / stages + first + last;
      tp += m * calls * ringWireBytes("all_reduce", A, t);
      tp += m * 3n * last * ringWireBytes("all_reduce", 4n * n, t);
      tpSteps += m * (calls + 3n * last) * 2n * (t - 1n);
      const sends = layout.pp > 1n ? (1n - last) + (1n - first) : 0n;
      pp += m * sends * A;
      ppSteps += m * sends;
    }
    let total = 0n;
    for (const k of P.rankStages(layout, rank)) total += P.stageParams(model, layout, k);
    const d = layout.dp;
    let dp = 0n, dpSteps = 0n;
    for (const [op, what] of DP_COLLECTIVES[layout.zero]) {
      dp += ringWireBytes(op, handedIn(op, what, policy, total, d), d);
      dpSteps += ALPHA_STEPS[op] * (d - 1n);
    }
    return { tp: [tp, tpSteps], pp: [pp, ppSteps], dp: [dp, dpSteps] };
  }

  /** [seconds by part with 'total', wire bytes per axis, FLOPs] of the busiest rank. */
  function stepTime(model, batch, policy, layout, hw) {
    const t = layout.tp, p = layout.pp, m = layout.micro_batches;
    const b = batch / (layout.dp * m);
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
    for (const axis of AXES) {
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
    for (const part of ["compute", "bubble", ...AXES]) total += seconds[part];
    seconds.total = total;
    return [seconds, wire, m * busiest];
  }

  Object.assign(P, {
    AXES, ringWireBytes, handedIn, stageFlops, axisLinks, rankMessages, stepTime,
  });
})();
