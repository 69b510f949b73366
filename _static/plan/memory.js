/* distcourse/plan/memory.py in JavaScript: bytes one rank holds during a step, by
   kind (see spec.js for how the port is held equal to the Python, and memory.py's
   docstring for every formula). BigInt throughout: exact, as Python's int. */
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

  /** parallel.tensor.memory.block_activation_bytes (CPU), summed over sub-layers. */
  function blockActivationBytes(b, s, h, a, tp, sp, e) {
    const normTokens = sp ? (b * s) / tp : b * s;
    const norm = normTokens * (h + 2n) * e;
    const attn = b * s * (h + (4n * h) / tp) * e + b * (a / tp) * s * e;
    const mlp = b * s * (h + (8n * h) / tp) * e;
    return norm + attn + norm + mlp;
  }

  function blockBytes(model, b, layout, e, ckpt) {
    const s = model.seq / layout.cp, h = model.hidden, a = model.heads, t = layout.tp;
    if (ckpt === "full") return (b * s * h * e) / (layout.sp ? t : 1n);
    const counts = blockActivationBytes(b, s, h, a, t, layout.sp, e);
    const lse = b * (a / t) * s * e;
    const moe = P.moeActivationDelta(model, b * s, t, e);
    return counts + moe - (ckpt === "selective" ? lse : 0n);
  }

  function stageActivationBytes(model, b, layout, policy, stage) {
    const stages = layout.pp * layout.virtual;
    const s = model.seq / layout.cp, h = model.hidden, V = model.vocab, t = layout.tp;
    const e = policy.activation_bytes, n = b * s;
    let held = (model.layers / stages) * blockBytes(model, b, layout, e, layout.ckpt);
    if (stage === 0n) held += (t > 1n ? 9n : 8n) * n + 8n * s;
    const last = stage === stages - 1n;
    if (last) {
      const normTokens = layout.sp ? n / t : n;
      held += normTokens * (h + 2n) * e + n * h * e;
      held += (4n * n * V) / t + 8n * n + 4n + (t > 1n ? n : 0n);
    }
    if (layout.pp > 1n) held += last ? 4n : n * h * e;
    return held;
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

  function buffers(model, b, policy, layout, groups, blocks) {
    let reduced = 0n, total = 0n;
    for (const [d, [n]] of groups) {
      if (d > 1n) reduced += n;
      total += n;
    }
    let out = bucketBytes(policy, layout, reduced);
    out += accumulationBytes(policy, layout, groups);
    const e = policy.activation_bytes;
    const sharded = layout.zero === 3n && max([...groups.keys()]) > 1n;
    if (sharded && !layout.reshard) {
      out += policy.weight_bytes * reduced;
    } else if (sharded) {
      const block = blockParams(model.hidden, layout.tp) + P.blockDelta(model, layout);
      const root = total - blocks * block;
      out += 2n * policy.weight_bytes * (block + root);
    }
    if (layout.ckpt !== "none") {
      out += blockBytes(model, b, layout, e, "none");
    }
    return out + P.axisBuffers(model, layout, (b * model.seq) / layout.cp, e);
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

  /** Bytes by kind on pipeline rank `rank` (any dp and tp coordinate). */
  function rankMemory(model, batch, policy, layout, rank) {
    const mine = rankStages(layout, rank);
    const zero = layout.zero;
    const out = { parameters: 0n, gradients: 0n, optimizer: 0n };
    const groups = rankGroups(model, layout, rank);
    for (const [d, [total, tensors]] of groups) {
      const stepped = zero === 0n || zero === 3n ? tensors : ceilDiv(tensors, d);
      const held = modelState(policy, zero, total, ceilDiv(total, d), stepped);
      for (const k of Object.keys(out)) out[k] += held[k];
    }
    const b = batch / (layout.shares * layout.micro_batches);
    const units = mine.map((k) => stageActivationBytes(model, b, layout, policy, k));
    if (layout.virtual === 1n || layout.pp === 1n) {
      out.activations = inFlight(layout, rank) * units[0];
    } else {
      out.activations = inFlightBytes(units, layout, rank);
    }
    const blocks = (BigInt(mine.length) * model.layers) / (layout.pp * layout.virtual);
    out.buffers = buffers(model, b, policy, layout, groups, blocks);
    return out;
  }

  /** [the fullest rank's bytes by kind with their 'total', every pipeline rank's]. */
  function memory(model, batch, policy, layout) {
    const ranks = [];
    for (let r = 0n; r < layout.pp; r++) {
      const bytes = rankMemory(model, batch, policy, layout, r);
      bytes.total = P.KINDS.reduce((sum, k) => sum + bytes[k], 0n);
      ranks.push(bytes);
    }
    const fullest = ranks.reduce((a, r) => (r.total > a.total ? r : a)); // first max
    return [fullest, ranks];
  }

  Object.assign(P, {
    ceilDiv, max, parametersHeld, blockParams, stageParams, stageTensors,
    rankStages, modelState, blockBytes, stageActivationBytes, inFlight,
    inFlightBytes, bucketBytes, accumulationBytes, buffers, rankGroups, rankMemory,
    memory,
  });
})();
