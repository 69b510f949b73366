/* distcourse/plan/predict.py in JavaScript: one prediction, as
   `Prediction.to_dict()` gives it (see spec.js for how the port is held equal to
   the Python). */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});

  /** Prediction.mfu: the model's FLOPs of the step over what the GPUs could do. */
  function mfu(model, batch, policy, layout, hw, seconds) {
    const b = batch / (layout.shares * layout.micro_batches);
    const plain = {
      pp: layout.pp, virtual: layout.virtual, schedule: layout.schedule,
      tp: 1n, ckpt: "none", cp: 1n,
    };
    let flops = 0n;
    for (let k = 0n; k < layout.pp * layout.virtual; k++) {
      flops += P.stageFlops(model, b, plain, k);
    }
    const useful = layout.shares * layout.micro_batches * flops;
    const most = P.peakFlops(hw, policy.matmul_dtype);
    return Number(useful) / (Number(layout.gpus) * most * seconds.total);
  }

  /**
   * The prediction of `data`: {model, batch, policy, layout, hardware} with the
   * key names of Prediction.to_dict (integers as BigInt), and `gpus` (BigInt, or
   * null not to check the count). Throws an Error naming the broken constraint,
   * with the Python's message, if the layout is impossible.
   */
  function predict(data, gpus) {
    const model = P.modelSpec(data.model);
    const policy = P.dtypePolicy(data.policy);
    const layout = P.planLayout(data.layout);
    const hw = P.hardwareCheck(data.hardware);
    const batch = data.batch;
    P.check(model, batch, layout, gpus);
    const ranks = P.memory(model, batch, policy, layout, hw);
    const peaks = ranks.map((moments) => P.peak(moments));
    let fullest = 0;
    peaks.forEach(([, kinds], r) => {
      if (kinds.total > peaks[fullest][1].total) fullest = r;
    });
    const moments = ranks[fullest];
    const held = {};
    for (const k of P.KINDS) held[k] = P.max(Object.values(moments).map((m) => m[k]));
    held.total = peaks[fullest][1].total;
    const totals = {};
    for (const [name, kinds] of Object.entries(moments)) totals[name] = P.momentTotal(kinds);
    const reserve = P.reserveBytes(layout, hw);
    const [seconds, messages, wire, flops] = P.stepTime(model, batch, policy, layout, hw);
    return {
      model: model,
      batch: batch,
      policy: { dtype: policy.dtype, reduce: policy.reduce, optimizer: policy.optimizer },
      layout: data.layout,
      hardware: hw,
      gpus: layout.gpus,
      params: P.params(model),
      memory: held,
      peak: peaks[fullest][1],
      moment: peaks[fullest][0],
      moments: totals,
      by_rank: peaks.map(([, kinds]) => kinds),
      reserve: reserve,
      fits: held.total + reserve <= BigInt(hw.memory),
      time: seconds,
      messages: messages,
      wire: wire,
      flops: flops,
      tokens_per_s: Number(batch * model.seq) / seconds.total,
      mfu: mfu(model, batch, policy, layout, hw, seconds),
    };
  }

  Object.assign(P, { mfu, predict });
})();
