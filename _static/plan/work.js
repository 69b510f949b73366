/* distcourse/plan/work.py in JavaScript: the FLOPs of a stage and the bytes its
   element-wise ops and the optimizer move (see spec.js for how the port is held
   equal to the Python, and work.py's docstring for every formula). BigInt. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const OPTIMIZER_BYTES = { "adamw-fused": 28n, adamw: 80n, sgd: 12n };

  /** Forward + backward (+ recompute) FLOPs of a stage, one micro-batch, whole;
      `ckpt` in place of the layout's. */
  function stageFlops(model, b, layout, stage, ckpt) {
    const stages = layout.pp * layout.virtual;
    const n = (b * model.seq) / layout.cp, s = model.seq, h = model.hidden;
    const blocks = model.layers / stages;
    const block = n * (24n * h * h + 4n * s * h) + P.moeFlopsDelta(model, n);
    let forward = blocks * block;
    if (stage === stages - 1n) forward += 2n * n * h * model.vocab;
    const recompute = {
      none: 0n,
      selective: blocks * 4n * n * s * h,
    }[ckpt ?? layout.ckpt] ?? blocks * block;
    return 3n * forward + recompute;
  }

  /** Bytes autocast's weight casts move for `elements` weights. */
  function weightCasts(elements, prec) {
    return prec.casts ? elements * (4n + P.nbytes(prec, "weight_copy")) : 0n;
  }

  /** Bytes one block's element-wise ops move in a forward on a rank of tp. */
  function blockTraffic(model, b, layout, prec) {
    const n = (b * model.seq) / layout.cp, h = model.hidden, t = layout.tp;
    const tokens = layout.sp ? n / t : n;
    const r = P.nbytes(prec, "residual"), o = P.nbytes(prec, "norm_out");
    const u = P.nbytes(prec, "value");
    let moved = tokens * h * (2n * (r + o) + 2n * (2n * r + u)) + (8n * u * n * h) / t;
    if (prec.casts) {
      moved += n * h * (prec.input_copies + 1n) * (o + P.nbytes(prec, "input"));
    }
    return moved + weightCasts((12n * h * h) / t, prec);
  }

  /** Bytes a stage's non-matmul ops move, forward and backward (+ recompute). */
  function stageTraffic(model, b, layout, prec, stage, ckpt) {
    const stages = layout.pp * layout.virtual, t = layout.tp;
    const n = (b * model.seq) / layout.cp, h = model.hidden, V = model.vocab;
    const blocks = model.layers / stages;
    let forward = blocks * blockTraffic(model, b, layout, prec);
    if (stage === stages - 1n) {
      const tokens = layout.sp ? n / t : n;
      const r = P.nbytes(prec, "residual"), o = P.nbytes(prec, "norm_out");
      forward += tokens * h * (r + o) + (P.nbytes(prec, "loss_traffic") * n * V) / t;
      forward += weightCasts((V * h) / t, prec);
    }
    const full = (ckpt ?? layout.ckpt) === "full";
    const recompute = full ? blocks * blockTraffic(model, b, layout, prec) : 0n;
    return 3n * forward + blocks * weightCasts((12n * h * h) / t, prec) + recompute;
  }

  /** Bytes the optimizer's step moves for `stepped` elements. */
  function optimizerTraffic(policy, stepped) {
    const extra = policy.dtype === "bf16" ? 6n : 0n;
    return (OPTIMIZER_BYTES[policy.optimizer] + extra) * stepped;
  }

  Object.assign(P, {
    OPTIMIZER_BYTES, stageFlops, weightCasts, blockTraffic, stageTraffic,
    optimizerTraffic,
  });
})();
