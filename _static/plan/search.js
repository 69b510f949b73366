/* distcourse/plan/prediction.py's `candidates` and `search` in JavaScript: every
   layout worth trying on a number of GPUs, and the predictions of those that fit,
   fastest first (see spec.js for how the port is held equal to the Python; the
   browser test compares the page's list with `plan.search`'s). */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});

  const DEGREES = ["dp", "tp", "pp", "micro_batches"];
  // ZeRO stage -> the (bucket_view, reshard) pairs the search tries
  const CHOICES = {
    0: [[true, true], [false, true]],
    1: [[true, true], [false, true]],
    2: [[true, true]],
    3: [[true, true], [true, false]],
  };

  /** The divisors of n (a BigInt), in order; none for 0. */
  function divisors(n) {
    const out = [];
    for (let k = 1n; k <= n; k++) if (n % k === 0n) out.push(k);
    return out;
  }

  /** A layout's fields as one string: equal layouts, equal keys. */
  function layoutKey(L) {
    return ["dp", "tp", "pp", "micro_batches", "zero", "sp", "ckpt", "schedule",
      "virtual", "bucket_view", "ep", "cp", "reshard"].map((k) => String(L[k])).join(",");
  }

  /**
   * prediction.candidates: every possible layout of `gpus` (BigInt) for the
   * model and batch, in the Python's order. `fixed`: PlanLayout keys kept (the
   * degrees among them) or set (the rest); ep and cp stay 1 unless fixed.
   */
  function candidates(model, batch, gpus, hw, fixed) {
    const rest0 = Object.assign({}, fixed || {});
    const keep = {};
    for (const k of DEGREES) {
      if (k in rest0) {
        keep[k] = rest0[k];
        delete rest0[k];
      }
    }
    const ep = rest0.ep ?? 1n, cp = rest0.cp ?? 1n;
    const rest = gpus % (ep * cp) === 0n ? gpus / (ep * cp) : 0n;
    const found = new Map(); // a set that keeps the order found
    const ds = divisors(rest);
    for (const dp of ds) {
      for (const tp of ds) {
        if (rest % (dp * tp) || tp > BigInt(hw.gpus_per_node)) continue;
        const pp = rest / (dp * tp);
        const share = batch % (dp * ep) === 0n ? batch / (dp * ep) : 0n;
        const ms = divisors(share).filter((m) => m >= pp);
        const runs = pp > 1n ? [["1f1b", 1n], ["interleaved", 2n]] : [["1f1b", 1n]];
        for (const m of ms) {
          for (let zero = 0n; zero < 4n; zero++) {
            for (const ckpt of P.CKPT) {
              for (const [schedule, virtual] of runs) {
                const plain = {
                  dp, tp, pp, micro_batches: m, zero, sp: tp > 1n, ckpt, schedule,
                  virtual, ep: 1n, cp: 1n,
                };
                const z = Number(rest0.zero ?? zero);
                for (const [view, reshard] of CHOICES[z]) {
                  const layout = Object.assign({}, plain,
                    { bucket_view: view, reshard: reshard }, rest0);
                  if (Object.entries(keep).some(([k, v]) => layout[k] !== v)) continue;
                  let L;
                  try {
                    L = P.planLayout(layout);
                    P.check(model, batch, L, gpus);
                  } catch (err) {
                    continue;
                  }
                  found.set(layoutKey(L), layout);
                }
              }
            }
          }
        }
      }
    }
    return [...found.values()];
  }

  /** Python's repr of `fixed`, as the search's error message writes it. */
  function fixedRepr(fixed) {
    const items = Object.entries(fixed).map(([k, v]) => `'${k}': ${P.repr(v)}`);
    return `{${items.join(", ")}}`;
  }

  /** prediction.fits: every pipeline rank's peak and the reserve within memory,
      without the time. */
  function fits(model, batch, policy, L, hw) {
    let most = 0n;
    for (const moments of P.memory(model, batch, policy, L, hw)) {
      const total = P.peak(moments)[1].total;
      if (total > most) most = total;
    }
    return most + P.reserveBytes(L, hw) <= BigInt(hw.memory);
  }

  /**
   * prediction.search: the predictions (as `predict` gives them) of every
   * candidate layout that fits, fastest first (ties: less memory); an Error with
   * the Python's message if no layout of `gpus` suits the model and batch at all.
   * `data`: {model, batch, policy, hardware} as `predict` takes them.
   */
  function search(data, gpus, fixed) {
    const model = P.modelSpec(data.model);
    const policy = P.dtypePolicy(data.policy);
    const hw = P.hardwareCheck(data.hardware);
    P.count(data.batch, "batch");
    P.count(gpus, "gpus");
    const every = candidates(model, data.batch, gpus, hw, fixed);
    if (!every.length) {
      const given = fixed && Object.keys(fixed).length;
      throw new Error(
        `no layout of ${gpus} GPUs suits this model and batch` +
          (given ? ` with ${fixedRepr(fixed)}` : "") +
          ": check that the batch divides by dp x micro-batches, heads and " +
          "vocab by tp, layers by pp"
      );
    }
    const fitting = every
      .filter((layout) => fits(model, data.batch, policy, P.planLayout(layout), hw))
      .map((layout) => P.predict(Object.assign({}, data, { layout }), null));
    const order = (a, b) => a.time.total - b.time.total
      || (a.memory.total < b.memory.total ? -1 : a.memory.total > b.memory.total ? 1 : 0);
    return fitting.sort(order);
  }

  Object.assign(P, { divisors, candidates, layoutKey, fits, search });
})();
