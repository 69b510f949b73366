/* distcourse/plan/memory.py in JavaScript: bytes one rank holds during a step, by
   kind, at each of the step's moments (see spec.js for how the port is held equal
   to the Python, and memory.py's docstring for every formula). BigInt throughout:
   exact, as Python's int. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const TENSORS_PER_BLOCK = 16n;

  function ceilDiv(x, y) {
    return (x + y - 1n) / y; // non-negative x, positive y: Python's -(-x // y)
  }

  function max(values) {
    return values.reduce((a, b) => (b > a ? b : a));
  }

  /** parallel.hybrid.cost.parameters_held for `stages` stages of tp = tp. */
  function parametersHeld(stages, tp, model, stage) {
    const C = model.hidden, V = model.vocab;
    const norms = 2n * (2n * C);
    const attention = (4n * (C * C)) / tp + (3n * C) / tp + C;
    const mlp = (4n * C * C + 4n * C) / tp + (4n * C * C) / tp + C;
    const perBlock = norms + attention + mlp;
    let held = (model.layers / stages) * perBlock;
    if (stage === 0n) held += (V * C) / tp + model.seq * C;
    if (stage === stages - 1n) held += 2n * C + (V * C) / tp;
    return held;
  }

  /** One block's parameters on a rank of tp = t. */
  function blockParams(h, t) {
    const attention = (4n * h * h) / t + (3n * h) / t + h;
    const mlp = (4n * h * h + 4n * h) / t + (4n * h * h) / t + h;
    return 4n * h + attention + mlp;
  }

  function stageParams(model, layout, stage) {
    return parametersHeld(layout.pp * layout.virtual, layout.tp, model, stage);
  }

  function stageTensors(model, layout, stage) {
    const stages = layout.pp * layout.virtual;
    const count = (TENSORS_PER_BLOCK * model.layers) / stages;
    return count + (stage === 0n ? 2n : 0n) + (stage === stages - 1n ? 3n : 0n);
  }

  /** Stages on pipeline rank `rank`: rank, rank + pp, ... (virtual of them). */
  function rankStages(layout, rank) {
    const out = [];
    for (let k = 0n; k < layout.virtual; k++) out.push(rank + k * layout.pp);
    return out;
  }

  function modelState(policy, zero, total, share, tensors) {
    return {
      parameters: policy.weight_bytes * (zero === 3n ? share : total),
      gradients: policy.grad_bytes * (zero >= 2n ? share : total),
      optimizer:
        policy.optimizer_bytes * (zero === 0n ? total : share) +
        policy.step_bytes * tensors,
    };
  }

  /** parallel.tensor.memory.block_activation_bytes, summed over sub-layers. */
  function blockActivationBytes(b, s, h, a, tp, sp, prec) {
    const n = b * s;
    const r = P.nbytes(prec, "residual"), z = P.nbytes(prec, "stats");
    const i = P.nbytes(prec, "input"), v = P.nbytes(prec, "value");
    const cast = P.nbytes(prec, "weight_copy");
    const normTokens = sp ? n / tp : n;
    const norm = normTokens * (h * r + 2n * z);
    let attn = n * (prec.input_copies * i * h + (4n * v * h) / tp);
    attn += P.attention(prec, b, a / tp, s, h / a) + (cast * 4n * h * h) / tp;
    const mlp = n * (i * h + (8n * v * h) / tp) + (cast * 8n * h * h) / tp;
    return norm + attn + norm + mlp;
  }

  function blockBytes(model, b, layout, prec, ckpt) {
    const s = model.seq / layout.cp, h = model.hidden, a = model.heads, t = layout.tp;
    if (ckpt === "full") {
      return (b * s * h * P.nbytes(prec, "residual")) / (layout.sp ? t : 1n);
    }
    const counts = blockActivationBytes(b, s, h, a, t, layout.sp, prec);
    const kernel = P.attention(prec, b, a / t, s, h / a);
    const moe = P.moeActivationDelta(model, b * s, t, prec);
    return counts + moe - (ckpt === "selective" ? kernel : 0n);
  }

  function stageActivationBytes(model, b, layout, prec, stage) {
    const stages = layout.pp * layout.virtual;
    const s = model.seq / layout.cp, h = model.hidden, V = model.vocab, t = layout.tp;
    const n = b * s, r = P.nbytes(prec, "residual");
    let held = (model.layers / stages) * blockBytes(model, b, layout, prec, layout.ckpt);
    if (stage === 0n) held += (t > 1n ? 9n : 8n) * n + 8n * s;
    const last = stage === stages - 1n;
    if (last) {
      const normTokens = layout.sp ? n / t : n;
      held += normTokens * (h * r + 2n * P.nbytes(prec, "stats"));
      held += n * h * P.nbytes(prec, "input") + (P.nbytes(prec, "weight_copy") * V * h) / t;
      const kept = P.nbytes(prec, t > 1n ? "value" : "log_probs");
      held += (kept * n * V) / t + 8n * n + 4n + (t > 1n ? n : 0n);
    }
    if (layout.pp > 1n) held += last ? 4n : n * h * r;
    return held;
  }

  /** The loss region at its worst beyond what the loss keeps (last stage). */
  function lossBytes(model, b, layout, prec) {
    const n = (b * model.seq) / layout.cp, t = layout.tp, u = P.nbytes(prec, "value");
    const per = t > 1n ? max([8n + u, 3n * u]) : P.nbytes(prec, "loss_extra");
    return (per * n * model.vocab) / t;
  }

  /** A block's backward at its largest, beyond what it keeps. */
  function temporaryBytes(model, b, layout, prec) {
    const n = (b * model.seq) / layout.cp, h = model.hidden, t = layout.tp;
    const u = P.nbytes(prec, "value"), r = P.nbytes(prec, "residual");
    return n * ((4n * u * h) / t + 2n * r * h);
  }

  /** What the optimizer's step allocates and frees. */
  function optimizerTemporaries(policy, prec, stepped, largest) {
    if (policy.optimizer !== "adamw") return 0n;
    return prec.device !== "cpu" ? 4n * stepped : 8n * (largest < stepped ? largest : stepped);
  }

  /** The largest parameter tensor on pipeline rank `rank`. */
  function largestTensor(model, layout, rank) {
    const h = model.hidden, t = layout.tp, stages = layout.pp * layout.virtual;
    const ends = rankStages(layout, rank).some((k) => k === 0n || k === stages - 1n);
    return max([(4n * h * h) / t, ends ? (model.vocab * h) / t : 0n]);
  }

  /** Micro-batches (GPipe, 1F1B) or stage units (interleaved) held at the peak. */
  function inFlight(layout, rank) {
    const p = layout.pp, m = layout.micro_batches, v = layout.virtual;
    if (p === 1n) return 1n; // gradient accumulation: one micro-batch at a time
    if (layout.schedule === "gpipe") return m;
    if (layout.schedule === "1f1b") return m < p - rank ? m : p - rank;
    const total = m * v;
    if (m === p) return total;
    const g = m / max([1n, m / p]);
    const walk = 2n * (p - rank - 1n) + (v - 1n) * g + 1n;
    return walk < total ? walk : total;
  }

  /** Peak bytes held on `rank` under interleaved 1F1B, walking its actions. */
  function inFlightBytes(units, layout, rank) {
    const p = layout.pp, m = layout.micro_batches, v = layout.virtual;
    const total = m * v, g = m / max([1n, m / p]);
    const ramp = 2n * (p - rank - 1n) + (v - 1n) * g;
    const warm = m === p ? total : ramp < total ? ramp : total;
    let now = 0n, peak = 0n;
    for (let f = 0n; f < total; f++) {
      now += units[Number((f / g) % v)];
      if (now > peak) peak = now;
      if (f >= warm) now -= units[Number(v - 1n - ((f - warm) / g) % v)];
    }
    return peak;
  }

  /** DDP's flat gradient buckets in the reduce dtype, of the elements reduced
      over more than one rank (none with bucket_view). */
  function bucketBytes(policy, layout, total) {
    const reduced = layout.dp * layout.ep * layout.cp > 1n;
    if (reduced && layout.zero <= 1n && !layout.bucket_view) {
      return policy.reduce_bytes * total;
    }
    return 0n;
  }

  /** The fp32 gradient accumulation buffer: 4 bytes a gradient element held (P,
      or the share q under ZeRO-2/3) when m > 1 sum gradients of a narrower dtype. */
  function accumulationBytes(policy, layout, groups) {
    if (layout.micro_batches === 1n || policy.grad_bytes >= 4n) return 0n;
    let held = 0n;
    for (const [d, [n]] of groups) held += layout.zero >= 2n ? ceilDiv(n, d) : n;
    return 4n * held;
  }

  /** Elements the optimizer of pipeline rank `rank` steps. */
  function steppedElements(model, layout, rank) {
    let out = 0n;
    for (const [d, [n]] of rankGroups(model, layout, rank)) {
      out += layout.zero === 0n ? n : ceilDiv(n, d);
    }
    return out;
  }

  /** Gathered units or parameters (ZeRO-3), a recomputed block, dispatch rows and
      ring messages: alive in forward and backward. */
  function transientBuffers(model, b, prec, policy, layout, groups, blocks) {
    let reduced = 0n, total = 0n;
    for (const [d, [n]] of groups) {
      if (d > 1n) reduced += n;
      total += n;
    }
    let out = 0n;
    const sharded = layout.zero === 3n && max([...groups.keys()]) > 1n;
    if (sharded && !layout.reshard) {
      out += policy.weight_bytes * reduced;
    } else if (sharded) {
      const block = blockParams(model.hidden, layout.tp) + P.blockDelta(model, layout);
      const root = total - blocks * block;
      out += 2n * policy.weight_bytes * (block + root);
    }
    if (layout.ckpt !== "none") out += blockBytes(model, b, layout, prec, "none");
    return out + P.axisBuffers(model, layout, (b * model.seq) / layout.cp, prec);
  }

  /** {group size: [elements, tensors]} on pipeline rank `rank` (axes.js). */
  function rankGroups(model, layout, rank) {
    const mine = rankStages(layout, rank);
    let total = 0n, tensors = 0n;
    for (const k of mine) {
      total += stageParams(model, layout, k);
      tensors += stageTensors(model, layout, k);
    }
    const blocks = (BigInt(mine.length) * model.layers) / (layout.pp * layout.virtual);
    return P.paramGroups(model, layout, total, tensors, blocks);
  }

  /** {moment: {kind: bytes}} on pipeline rank `rank`: the kinds alive at each
      moment (the loss's only on the last stage), in MOMENTS' order. */
  function rankMoments(model, batch, policy, layout, rank, hw) {
    const prec = P.hwPrecision(hw, policy), mine = rankStages(layout, rank);
    const zero = layout.zero;
    const state = { parameters: 0n, gradients: 0n, optimizer: 0n };
    const groups = rankGroups(model, layout, rank);
    for (const [d, [elements, tensors]] of groups) {
      const steps = zero === 0n || zero === 3n ? tensors : ceilDiv(tensors, d);
      const held = modelState(policy, zero, elements, ceilDiv(elements, d), steps);
      for (const k of Object.keys(state)) state[k] += held[k];
    }
    const b = batch / (layout.shares * layout.micro_batches);
    const units = mine.map((k) => stageActivationBytes(model, b, layout, prec, k));
    const activations = layout.virtual === 1n || layout.pp === 1n
      ? inFlight(layout, rank) * units[0]
      : inFlightBytes(units, layout, rank);
    const blocks = (BigInt(mine.length) * model.layers) / (layout.pp * layout.virtual);
    let reduced = 0n;
    for (const [d, [n]] of groups) if (d > 1n) reduced += n;
    const persistent = bucketBytes(policy, layout, reduced) +
      accumulationBytes(policy, layout, groups);
    const transient = transientBuffers(model, b, prec, policy, layout, groups, blocks);
    const viewed = layout.bucket_view && zero <= 1n && reduced > 0n;
    const early = layout.micro_batches > 1n || viewed ? state.gradients : 0n;
    const base = {};
    for (const k of P.KINDS) base[k] = 0n;
    Object.assign(base, {
      parameters: state.parameters, optimizer: state.optimizer,
      workspace: BigInt(hw.workspace),
    });
    const going = { ...base, gradients: early, activations, buffers: persistent + transient };
    const out = {
      backward: { ...going, temporaries: temporaryBytes(model, b, layout, prec) },
    };
    if (mine[mine.length - 1] === layout.pp * layout.virtual - 1n) {
      out.loss = { ...going, loss: lossBytes(model, b, layout, prec) };
    }
    const stepped = steppedElements(model, layout, rank);
    const largest = largestTensor(model, layout, rank);
    out.step = {
      ...base, gradients: state.gradients, buffers: persistent,
      temporaries: optimizerTemporaries(policy, prec, stepped, largest),
    };
    const ordered = {};
    for (const name of P.MOMENTS) if (name in out) ordered[name] = out[name];
    return ordered;
  }

  /** The bytes of a moment: its kinds added. */
  function momentTotal(kinds) {
    return P.KINDS.reduce((sum, k) => sum + kinds[k], 0n);
  }

  /** [the largest moment's name, its kinds with their 'total'] (first of equals). */
  function peak(moments) {
    let name = null;
    for (const m of Object.keys(moments)) {
      if (name === null || momentTotal(moments[m]) > momentTotal(moments[name])) name = m;
    }
    return [name, { ...moments[name], total: momentTotal(moments[name]) }];
  }

  /** The CUDA context and NCCL's buffers for each process group of more than one
      rank. */
  function reserveBytes(layout, hw) {
    let groups = 0n;
    for (const a of ["dp", "tp", "pp", "ep", "cp"]) if (layout[a] > 1n) groups += 1n;
    return BigInt(hw.context) + BigInt(hw.nccl) * groups;
  }

  /** Every pipeline rank's moments, first to last. */
  function memory(model, batch, policy, layout, hw) {
    const ranks = [];
    for (let r = 0n; r < layout.pp; r++) {
      ranks.push(rankMoments(model, batch, policy, layout, r, hw));
    }
    return ranks;
  }

  Object.assign(P, {
    ceilDiv, max, parametersHeld, blockParams, stageParams, stageTensors,
    rankStages, modelState, blockActivationBytes, blockBytes, stageActivationBytes,
    lossBytes, temporaryBytes, optimizerTemporaries, largestTensor, inFlight,
    inFlightBytes, bucketBytes, accumulationBytes, steppedElements, transientBuffers,
    rankGroups, rankMoments, momentTotal, peak, reserveBytes, memory,
  });
})();
