/* distcourse/plan/axes.py in JavaScript: experts (ep) and context parallelism
   (cp), with parallel/experts/cost.py's balanced_bytes and memory_per_rank and
   parallel/context/cost.py's ring_bytes (see spec.js for how the port is held
   equal to the Python, and axes.py's docstring for every formula). */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const HANDSHAKE = 160n; // context.cost: a header and an ack of 80 bytes a pass
  const AGREE = 112n; // the agreement row: 14 int64

  /** context.cost.ring_bytes (backward and the check included). */
  function ringBytes(kv, cp) {
    if (cp === 1n) return 0n;
    let total = (cp - 1n) * (2n * kv + HANDSHAKE);
    total += (cp - 1n) * (4n * kv + HANDSHAKE) + 2n * kv + HANDSHAKE;
    return total + AGREE * (cp - 1n);
  }

  /** experts.cost.balanced_bytes: one MoE layer's step on one rank. */
  function balancedBytes(tokens, C, E, k, ep, b) {
    if (ep === 1n) return 0n;
    const rows = k * tokens * C * b;
    return (4n * (ep - 1n) * rows) / ep + (8n * E * (ep - 1n)) / ep;
  }

  /** experts.router.capacity: math.ceil(f * k * tokens / E), in floats. */
  function capacity(tokens, E, k, f) {
    return BigInt(Math.ceil((f * Number(k) * Number(tokens)) / Number(E)));
  }

  /** experts.cost.memory_per_rank(...)["buffers"]. */
  function dispatchBuffers(tokens, C, E, k, f, ep, b) {
    const local = E / ep;
    return 2n * capacity(tokens, E, k, f) * ep * local * C * b;
  }

  function mlpParams(h, t) {
    return (4n * h * h + 4n * h) / t + (4n * h * h) / t + h;
  }

  /** axes.param_groups: [[group size, [elements, tensors]], ...] in Python's order. */
  function paramGroups(model, layout, dense, tensors, blocks) {
    const d = layout.dp * layout.cp;
    if (!model.experts) return new Map([[d * layout.ep, [dense, tensors]]]);
    const E = model.experts, h = model.hidden, local = model.experts / layout.ep;
    const experts = blocks * local * mlpParams(h, layout.tp);
    dense += blocks * (h * E - mlpParams(h, layout.tp));
    const groups = new Map([[d * layout.ep, [dense, tensors - 3n * blocks]]]);
    const [n, t] = groups.get(d) ?? [0n, 0n];
    groups.set(d, [n + experts, t + 4n * blocks * local]);
    return groups;
  }

  function blockDelta(model, layout) {
    if (!model.experts) return 0n;
    const mlp = mlpParams(model.hidden, layout.tp);
    return (model.experts / layout.ep - 1n) * mlp + model.hidden * model.experts;
  }

  function moeActivationDelta(model, n, t, prec) {
    if (!model.experts) return 0n;
    const h = model.hidden, k = model.top_k;
    const i = P.nbytes(prec, "input"), u = P.nbytes(prec, "value");
    const dense = n * (i * h + (8n * u * h) / t);
    return n * i * h + n * model.experts * u + k * dense - dense;
  }

  function moeFlopsDelta(model, n) {
    if (!model.experts) return 0n;
    const h = model.hidden;
    return n * ((model.top_k - 1n) * 16n * h * h + 2n * h * model.experts);
  }

  function axisBuffers(model, layout, n, prec) {
    const e = P.nbytes(prec, "value");
    let out = 0n;
    if (model.experts) {
      out += dispatchBuffers(
        n, model.hidden, model.experts, model.top_k, model.capacity_factor,
        layout.ep, e
      );
    }
    if (layout.cp > 1n) out += 8n * n * (model.hidden / layout.tp) * e;
    return out;
  }

  /** {cp, ep}: [wire bytes, alpha steps] of one layer's step (degrees above 1). */
  function layerMessages(model, layout, n, prec) {
    const c = layout.cp, ep = layout.ep, e = P.nbytes(prec, "value");
    const out = {};
    if (c > 1n) {
      const kv = n * (model.hidden / layout.tp) * e;
      out.cp = [ringBytes(kv, c), 3n * c - 2n];
    }
    if (ep > 1n) {
      const h = model.hidden, E = model.experts, k = model.top_k;
      out.ep = [balancedBytes(n, h, E, k, ep, e), 5n * (ep - 1n)];
    }
    return out;
  }

  Object.assign(P, {
    ringBytes, balancedBytes, capacity, dispatchBuffers, mlpParams, paramGroups,
    blockDelta, moeActivationDelta, moeFlopsDelta, axisBuffers, layerMessages,
  });
})();
