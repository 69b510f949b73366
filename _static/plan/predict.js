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
    const peak = P.rate(hw, policy.dtype) / hw.efficiency;
    return Number(useful) / (Number(layout.gpus) * peak * seconds.total);
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
    const [fullest, ranks] = P.memory(model, batch, policy, layout);
    const [seconds, wire, flops] = P.stepTime(model, batch, policy, layout, hw);
    return {
      model: model,
      batch: batch,
      policy: { dtype: policy.dtype, reduce: policy.reduce, optimizer: policy.optimizer },
      layout: data.layout,
      hardware: hw,
      gpus: layout.gpus,
      params: P.params(model),
      memory: fullest,
      by_rank: ranks,
      fits: fullest.total <= hw.memory,
      time: seconds,
      wire: wire,
      flops: flops,
      tokens_per_s: Number(batch * model.seq) / seconds.total,
      mfu: mfu(model, batch, policy, layout, hw, seconds),
    };
  }

  Object.assign(P, { mfu, predict });
})();
