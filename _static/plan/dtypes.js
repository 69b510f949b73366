/* distcourse/parallel/tensor/dtypes.py and distcourse/sdpa.py in JavaScript: the
   bytes each tensor of a step weighs under a dtype policy on a device, and what the
   attention kernel torch picks keeps (see spec.js for how the port is held equal
   to the Python). Only the case a plan asks about is ported: causal
   self-attention, no mask, no dropout, every kernel enabled. */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});

  const TENSORS = [
    "residual", "stats", "norm_out", "input", "value", "weight_copy", "log_probs",
    "loss_extra", "loss_traffic",
  ];
  const BYTES = { // policy -> bytes of each of TENSORS, on CUDA
    fp32: [4n, 4n, 4n, 4n, 4n, 0n, 4n, 8n, 8n],
    bf16: [2n, 4n, 2n, 2n, 2n, 0n, 4n, 8n, 14n],
    "amp-bf16": [4n, 4n, 4n, 2n, 2n, 2n, 6n, 4n, 10n],
  };
  const CPU = { // what differs on the CPU
    bf16: { stats: 2n },
    "amp-bf16": { log_probs: 4n, loss_extra: 8n, loss_traffic: 14n },
  };

  /** dtypes.Precision: a policy ("fp32" | "bf16" | "amp-bf16") on a device
      ("cuda" | "cpu") of a compute capability [major, minor]. */
  function precision(policy, device, capability) {
    const table = {};
    TENSORS.forEach((name, i) => (table[name] = BYTES[policy][i]));
    if (device === "cpu") Object.assign(table, CPU[policy] || {});
    const casts = policy === "amp-bf16";
    return {
      policy, device, capability: capability || [9, 0], table,
      casts, input_copies: casts ? 3n : 1n,
      matmul_dtype: policy === "fp32" ? "fp32" : "bf16",
    };
  }

  /** Precision.nbytes. */
  function nbytes(prec, tensor) {
    if (!(tensor in prec.table)) throw new Error(`unknown tensor '${tensor}'`);
    return prec.table[tensor];
  }

  function between(capability, low) {
    const [a, b] = capability;
    const after = a > low[0] || (a === low[0] && b >= low[1]);
    const before = a < 12 || (a === 12 && b <= 1);
    return after && before;
  }

  /** sdpa.choose_kernel for causal self-attention, no mask, no dropout, every
      kernel enabled, the sequence lengths unknown (every rule that reads them
      passes). */
  function chooseKernel(device, dtype, headDim, capability) {
    const d = Number(headDim), [major, minor] = capability;
    const half = dtype === "bf16"; // the planner's dtypes: fp32 or bf16
    const lowPrecision = half && major >= 8;
    if (device === "cpu") return "cpu_flash";
    const checks = {
      cudnn: () => lowPrecision && between(capability, [8, 0]) && d % 8 === 0 &&
        d <= 128,
      flash: () => {
        const limited = (major === 8 && minor >= 6 && minor <= 9) || (major === 12 &&
          minor <= 1);
        if (limited && !(d <= 192 || d > 224)) return false;
        return d <= 256 && between(capability, [8, 0]) && lowPrecision;
      },
      efficient: () => {
        const tensorCores = major >= 8 || (major >= 7 && half);
        let alignment = major >= 8 ? 4 : 1;
        if (tensorCores) alignment = Math.max(alignment, 128 / (half ? 16 : 32));
        const dtypes = half ? major >= 8 : true;
        return between(capability, [5, 0]) && d % alignment === 0 && dtypes;
      },
      math: () => true,
    };
    const order = major === 9 || major === 10
      ? ["cudnn", "flash", "efficient", "math"]
      : ["flash", "efficient", "math", "cudnn"];
    return order.find((k) => checks[k]());
  }

  /** sum(sdpa.saved_bytes(kernel, ...).values()). */
  function savedBytes(kernel, batch, heads, seq, headDim, dtype) {
    const tokens = batch * heads * seq, f32 = 4n, i64 = 8n;
    if (kernel === "cudnn") return tokens * f32 + 2n * i64;
    if (kernel === "flash") {
      const pad = (8n - (headDim % 8n)) % 8n, size = dtype === "fp32" ? 4n : 2n;
      const padding = pad ? 4n * tokens * pad * size + tokens * headDim * size : 0n;
      return tokens * f32 + 3n * i64 + padding;
    }
    if (kernel === "efficient") {
      return batch * heads * ((seq + 31n) / 32n) * 32n * f32 + 2n * i64;
    }
    if (kernel === "cpu_flash") return tokens * f32; // fp32 and bf16 alike
    if (dtype === "fp32") return tokens * seq * f32;
    return tokens * seq * f32 + 3n * tokens * headDim * (f32 - 2n);
  }

  /** Precision.attention: what the kernel keeps beyond q, k, v and its output. */
  function attention(prec, batch, heads, seq, headDim) {
    const kernel = chooseKernel(prec.device, prec.matmul_dtype, headDim, prec.capability);
    return savedBytes(kernel, batch, heads, seq, headDim, prec.matmul_dtype);
  }

  Object.assign(P, {
    TENSORS, precision, nbytes, chooseKernel, savedBytes, attention,
  });
})();
