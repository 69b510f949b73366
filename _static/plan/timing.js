/* distcourse/plan/timing.py in JavaScript: seconds of one training step, data-
   parallel messages hidden behind the compute they overlap (see spec.js for how
   the port is held equal to the Python, and timing.py's docstring for every
   formula). Counts are BigInt; seconds are floats, in Python's order. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const AXES = ["tp", "pp", "dp"];
  const PARTS = ["compute", "memory", "optimizer", "bubble"];
  // ZeRO stage -> [op, which bytes, once a "step" or every "micro"-batch, the pass
  // it hides behind]
  const DP_COLLECTIVES = {
    0: [["all_reduce", "grad", "step", "backward"]],
    1: [
      ["reduce_scatter", "grad", "step", "backward"],
      ["all_gather", "weight", "step", "none"],
    ],
    2: [
      ["reduce_scatter", "grad", "micro", "backward"],
      ["all_gather", "weight", "step", "none"],
    ],
    3: [
      ["all_gather", "weight", "micro", "forward"],
      ["all_gather", "weight", "micro", "backward"],
      ["reduce_scatter", "grad", "micro", "backward"],
    ],
  };
  const KEPT = [
    ["all_gather", "weight", "micro", "forward"],
    ["reduce_scatter", "grad", "micro", "backward"],
  ];
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

  /** [op, which bytes, times in a step, the pass it hides behind] of the
      layout's ZeRO stage: "micro" ones m times; ZeRO-3 without reshard, KEPT. */
  function dpCalls(layout) {
    const kept = layout.zero === 3n && !layout.reshard;
    const chosen = kept ? KEPT : DP_COLLECTIVES[layout.zero];
    const m = layout.micro_batches;
    return chosen.map(([op, what, when, hides]) => [
      op, what, when === "micro" ? m : 1n, hides,
    ]);
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
  function rankMessages(model, batch, policy, layout, rank, prec) {
    const stages = layout.pp * layout.virtual, t = layout.tp, m = layout.micro_batches;
    const b = batch / (layout.shares * m);
    const n = (b * model.seq) / layout.cp;
    const A = n * model.hidden * P.nbytes(prec, "value");
    const sent = n * model.hidden * P.nbytes(prec, "residual");
    let tp = 0n, pp = 0n, tpSteps = 0n, ppSteps = 0n;
    const out = {};
    for (const a of layoutAxes(layout)) out[a] = [0n, 0n];
    const layer = P.layerMessages(model, layout, n, prec);
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
      pp += m * sends * sent;
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

  /** Seconds of rank `rank`'s data-parallel messages its compute does not hide,
      its [forward, backward] seconds a micro-batch `passes`. */
  function exposedDp(model, policy, layout, rank, hw, passes) {
    const [alpha, beta] = P.link(hw, axisLinks(layout, hw).dp);
    const hidden = { micro: { forward: 0.0, backward: 0.0 }, step: { forward: 0.0, backward: 0.0 } };
    let unhidden = 0.0;
    const m = layout.micro_batches;
    for (const [d, [total]] of P.rankGroups(model, layout, rank)) {
      for (const [op, what, times, hides] of dpCalls(layout)) {
        const nbytes = ringWireBytes(op, handedIn(op, what, policy, total, d), d);
        const seconds = Number(ALPHA_STEPS[op] * (d - 1n)) * alpha + Number(nbytes) * beta;
        if (hides === "none") unhidden += Number(times) * seconds;
        else hidden[times > 1n ? "micro" : "step"][hides] += seconds;
      }
    }
    let out = unhidden;
    ["forward", "backward"].forEach((x, i) => {
      const micro = hidden.micro[x], step = hidden.step[x], pass = passes[i];
      out += Number(m - 1n) * Math.max(0.0, micro - pass);
      out += Math.max(0.0, micro + step - pass);
    });
    return out;
  }

  /** [FLOPs, bytes, forward FLOPs, forward bytes] of a micro-batch on pipeline
      rank `rank`, after the split over tp. */
  function rankWork(model, b, layout, prec, rank) {
    let flops = 0n, traffic = 0n, fwdFlops = 0n, fwdTraffic = 0n;
    for (const k of P.rankStages(layout, rank)) {
      flops += P.stageFlops(model, b, layout, k);
      traffic += P.stageTraffic(model, b, layout, prec, k);
      fwdFlops += P.stageFlops(model, b, layout, k, "none") / 3n;
      fwdTraffic += P.stageTraffic(model, b, layout, prec, k, "none") / 3n;
    }
    const t = layout.tp;
    return [flops / t, traffic, fwdFlops / t, fwdTraffic];
  }

  /** [seconds by part with 'total', message seconds per axis before overlap, wire
      bytes per axis, FLOPs] of the busiest rank. */
  function stepTime(model, batch, policy, layout, hw) {
    const p = layout.pp, m = layout.micro_batches, prec = P.hwPrecision(hw, policy);
    const b = batch / (layout.shares * m);
    const rate = P.rate(hw, policy.matmul_dtype), streamed = P.streamed(hw);
    const work = [];
    for (let r = 0n; r < p; r++) work.push(rankWork(model, b, layout, prec, r));
    const units = work.map(([f, bytes]) => Number(f) / rate + Number(bytes) / streamed);
    let busiest = 0;
    units.forEach((u, r) => { if (u > units[busiest]) busiest = r; });
    const [flops, traffic] = work[busiest];
    const seconds = {
      compute: Number(m * flops) / rate,
      memory: Number(m * traffic) / streamed,
    };
    let stepped = 0n;
    for (let r = 0n; r < p; r++) {
      const s = P.steppedElements(model, layout, r);
      if (s > stepped) stepped = s;
    }
    seconds.optimizer = Number(P.optimizerTraffic(policy, stepped)) / streamed;
    seconds.bubble = (Number(p - 1n) / Number(layout.virtual)) * units[busiest];
    const where = axisLinks(layout, hw);
    const wire = {}, messages = {};
    const sent = [];
    for (let r = 0n; r < p; r++) sent.push(rankMessages(model, batch, policy, layout, r, prec));
    const axes = layoutAxes(layout);
    for (const axis of axes) {
      const [alpha, beta] = P.link(hw, where[axis]);
      wire[axis] = 0n;
      messages[axis] = 0.0;
      for (const one of sent) {
        const [nbytes, steps] = one[axis];
        messages[axis] = Math.max(messages[axis], Number(steps) * alpha + Number(nbytes) * beta);
        if (nbytes > wire[axis]) wire[axis] = nbytes;
      }
      seconds[axis] = messages[axis];
    }
    let exposed = 0.0;
    work.forEach(([, , fwdFlops, fwdTraffic], r) => {
      const forward = Number(fwdFlops) / rate + Number(fwdTraffic) / streamed;
      const passes = [forward, units[r] - forward];
      exposed = Math.max(exposed, exposedDp(model, policy, layout, BigInt(r), hw, passes));
    });
    seconds.dp = exposed;
    let total = 0;
    for (const part of [...PARTS, ...axes]) total += seconds[part];
    seconds.total = total;
    return [seconds, messages, wire, m * flops];
  }

  Object.assign(P, {
    AXES, PARTS, ringWireBytes, handedIn, dpCalls, layoutAxes, axisLinks,
    rankMessages, exposedDp, rankWork, stepTime,
  });
})();
