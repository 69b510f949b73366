/* distcourse/plan/hardware.py in JavaScript: the datasheet GPUs, their rate and
   links (see spec.js for how the port is held equal to the Python). */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const GB = 10 ** 9;

  function datasheet(name, fp32, bf16, memoryGb, nvlink, nic, url) {
    return {
      name: name,
      flops_fp32: fp32 * 1e12,
      flops_bf16: bf16 * 1e12,
      efficiency: 0.5,
      memory: memoryGb * GB,
      gpus_per_node: 8,
      alpha_node: 5e-6,
      beta_node: 1 / ((nvlink / 2) * GB),
      alpha_network: 10e-6,
      beta_network: 1 / (nic * GB),
      source: url,
    };
  }

  const GPUS = {
    h100: datasheet("H100 SXM", 67, 989.5, 80, 900, 50,
      "https://www.nvidia.com/en-us/data-center/h100/"),
    h200: datasheet("H200 SXM", 67, 989.5, 141, 900, 50,
      "https://www.nvidia.com/en-us/data-center/h200/"),
    a100: datasheet("A100 SXM 80GB", 19.5, 312, 80, 600, 25,
      "https://www.nvidia.com/en-us/data-center/a100/"),
  };

  /* The planner's form gives a GPU in the datasheets' units: the figures above,
     as `datasheet` takes them (NVLink a direction: half the datasheet's figure). */
  const SHEETS = {};
  for (const [key, [fp32, bf16, memoryGb, nvlink, nic]] of Object.entries({
    h100: [67, 989.5, 80, 900, 50], h200: [67, 989.5, 141, 900, 50],
    a100: [19.5, 312, 80, 600, 25],
  })) {
    SHEETS[key] = {
      tflops_fp32: fp32, tflops_bf16: bf16, memory_gb: memoryGb, node_gbs: nvlink / 2,
      network_gbs: nic, alpha_node_us: 5, alpha_network_us: 10, efficiency: 0.5,
      gpus_per_node: 8,
    };
  }

  /** A Hardware from the form's units (TFLOP/s, GB, GB/s, microseconds), by the
      operations `datasheet` uses: the presets come out bit for bit equal. */
  function fromSheet(name, source, f) {
    const memory = f.memory_gb * GB;
    return {
      name: name,
      flops_fp32: f.tflops_fp32 * 1e12,
      flops_bf16: f.tflops_bf16 * 1e12,
      efficiency: f.efficiency,
      memory: Number.isFinite(memory) ? BigInt(Math.trunc(memory)) : memory,
      gpus_per_node: f.gpus_per_node,
      alpha_node: f.alpha_node_us / 1e6,
      beta_node: 1 / (f.node_gbs * GB),
      alpha_network: f.alpha_network_us / 1e6,
      beta_network: 1 / (f.network_gbs * GB),
      source: source,
    };
  }

  /** Hardware.rate: FLOP/s a step reaches, the dtype's peak x efficiency. */
  function rate(hw, dtype) {
    return (dtype === "fp32" ? hw.flops_fp32 : hw.flops_bf16) * hw.efficiency;
  }

  /** Hardware.link: (alpha, beta) of 'node' or 'network'. */
  function link(hw, where) {
    return where === "network"
      ? [hw.alpha_network, hw.beta_network]
      : [hw.alpha_node, hw.beta_node];
  }

  /** Hardware.__post_init__: the checks of a GPU's figures, the reader's edits. */
  function hardwareCheck(hw) {
    for (const name of ["flops_fp32", "flops_bf16", "efficiency", "memory"]) {
      if (!(hw[name] > 0)) throw new Error(`${name} must be positive, got ${P.repr(hw[name])}`);
    }
    for (const name of ["alpha_node", "beta_node", "alpha_network", "beta_network"]) {
      if (!(hw[name] >= 0)) throw new Error(`${name} must be >= 0, got ${P.repr(hw[name])}`);
    }
    const g = hw.gpus_per_node;
    if (!((typeof g === "bigint" && g >= 1n) || (Number.isInteger(g) && g >= 1))) {
      throw new Error(`gpus_per_node must be an integer >= 1, got ${P.repr(g)}`);
    }
    return hw;
  }

  Object.assign(P, { GB, GPUS, SHEETS, fromSheet, rate, link, hardwareCheck });
})();
