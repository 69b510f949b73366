/* distcourse/plan/hardware.py in JavaScript: the datasheet GPUs, their rates,
   memory and links (see spec.js for how the port is held equal to the Python). */
(function () {
  "use strict";
  const P = (window.dcPlan = window.dcPlan || {});
  const GB = 10 ** 9;
  const MIB = 2 ** 20;
  const ARCHES = ["sm80", "sm90", "cpu"];

  function datasheet(name, flops, bandwidthTbs, memoryMib, links, arch, url) {
    const cublas = arch === "sm90" ? 32 * MIB : 4096 * 1024 * 2 + 16 * 1024 * 8;
    return {
      name: name,
      flops_fp32: flops[0] * 1e12,
      flops_bf16: flops[1] * 1e12,
      efficiency_fp32: 0.8,
      efficiency_bf16: 0.65,
      bandwidth: bandwidthTbs * 1e12,
      efficiency_memory: 0.8,
      memory: memoryMib * MIB,
      workspace: 2 * cublas,
      context: 512 * MIB,
      nccl: 512 * MIB,
      gpus_per_node: 8,
      alpha_node: 5e-6,
      beta_node: 1 / ((links[0] / 2) * GB),
      alpha_network: 10e-6,
      beta_network: 1 / (links[1] * GB),
      arch: arch,
      source: url,
    };
  }

  const FIGURES = { // fp32 and bf16 TFLOP/s, TB/s, MiB, NVLink and NIC GB/s, arch
    h100: ["H100 SXM", [67, 989.5], 3.35, 81559, [900, 50], "sm90",
      "https://www.nvidia.com/en-us/data-center/h100/"],
    h200: ["H200 SXM", [67, 989.5], 4.8, 143771, [900, 50], "sm90",
      "https://www.nvidia.com/en-us/data-center/h200/"],
    a100: ["A100 SXM 80GB", [19.5, 312], 2.039, 81920, [600, 25], "sm80",
      "https://www.nvidia.com/en-us/data-center/a100/"],
  };
  const GPUS = {};
  for (const [key, f] of Object.entries(FIGURES)) GPUS[key] = datasheet(...f);

  /* The planner's form gives a GPU in the datasheets' units: the figures above,
     as `datasheet` takes them (NVLink a direction: half the datasheet's figure;
     memory in MiB as nvidia-smi reports it). */
  const SHEETS = {};
  for (const [key, f] of Object.entries(FIGURES)) {
    const hw = GPUS[key];
    SHEETS[key] = {
      tflops_fp32: f[1][0], tflops_bf16: f[1][1], efficiency_fp32: 0.8,
      efficiency_bf16: 0.65, bandwidth_tbs: f[2], efficiency_memory: 0.8,
      memory_mib: f[3], workspace_mib: hw.workspace / MIB, context_mib: 512,
      nccl_mib: 512, node_gbs: f[4][0] / 2, network_gbs: f[4][1], alpha_node_us: 5,
      alpha_network_us: 10, gpus_per_node: 8,
    };
  }

  function bytes(value) {
    return Number.isFinite(value) ? BigInt(Math.trunc(value)) : value;
  }

  /** A Hardware from the form's units (TFLOP/s, TB/s, MiB, GB/s, microseconds),
      by the operations `datasheet` uses: the presets come out bit for bit equal. */
  function fromSheet(name, source, arch, f) {
    return {
      name: name,
      flops_fp32: f.tflops_fp32 * 1e12,
      flops_bf16: f.tflops_bf16 * 1e12,
      efficiency_fp32: f.efficiency_fp32,
      efficiency_bf16: f.efficiency_bf16,
      bandwidth: f.bandwidth_tbs * 1e12,
      efficiency_memory: f.efficiency_memory,
      memory: bytes(f.memory_mib * MIB),
      workspace: bytes(f.workspace_mib * MIB),
      context: bytes(f.context_mib * MIB),
      nccl: bytes(f.nccl_mib * MIB),
      gpus_per_node: f.gpus_per_node,
      alpha_node: f.alpha_node_us / 1e6,
      beta_node: 1 / (f.node_gbs * GB),
      alpha_network: f.alpha_network_us / 1e6,
      beta_network: 1 / (f.network_gbs * GB),
      arch: arch,
      source: source,
    };
  }

  /** Hardware.rate: FLOP/s the matmuls reach in `dtype`. */
  function rate(hw, dtype) {
    return dtype === "fp32"
      ? hw.flops_fp32 * hw.efficiency_fp32
      : hw.flops_bf16 * hw.efficiency_bf16;
  }

  /** Hardware.peak: the datasheet's FLOP/s in `dtype`. */
  function peakFlops(hw, dtype) {
    return dtype === "fp32" ? hw.flops_fp32 : hw.flops_bf16;
  }

  /** Hardware.streamed: bytes/s element-wise kernels move. */
  function streamed(hw) {
    return hw.bandwidth * hw.efficiency_memory;
  }

  /** Hardware.link: (alpha, beta) of 'node' or 'network'. */
  function link(hw, where) {
    return where === "network"
      ? [hw.alpha_network, hw.beta_network]
      : [hw.alpha_node, hw.beta_node];
  }

  /** Hardware.precision: the policy on this hardware's device. */
  function hwPrecision(hw, policy) {
    if (hw.arch === "cpu") return P.precision(policy.dtype, "cpu");
    const capability = [Number(hw.arch.slice(2, -1)), Number(hw.arch.slice(-1))];
    return P.precision(policy.dtype, "cuda", capability);
  }

  /** Hardware.__post_init__: the checks of a GPU's figures, the reader's edits. */
  function hardwareCheck(hw) {
    const positive = ["flops_fp32", "flops_bf16", "efficiency_fp32", "efficiency_bf16",
      "bandwidth", "efficiency_memory", "memory"];
    for (const name of positive) {
      if (!(hw[name] > 0)) throw new Error(`${name} must be positive, got ${P.repr(hw[name])}`);
    }
    for (const name of ["workspace", "context", "nccl"]) {
      if (!(hw[name] >= 0)) throw new Error(`${name} must be >= 0, got ${P.repr(hw[name])}`);
    }
    for (const name of ["alpha_node", "beta_node", "alpha_network", "beta_network"]) {
      if (!(hw[name] >= 0)) throw new Error(`${name} must be >= 0, got ${P.repr(hw[name])}`);
    }
    const g = hw.gpus_per_node;
    if (!((typeof g === "bigint" && g >= 1n) || (Number.isInteger(g) && g >= 1))) {
      throw new Error(`gpus_per_node must be an integer >= 1, got ${P.repr(g)}`);
    }
    if (!ARCHES.includes(hw.arch)) {
      throw new Error(`arch must be one of ${ARCHES.join(", ")}, got ${P.repr(hw.arch)}`);
    }
    return hw;
  }

  Object.assign(P, {
    GB, MIB, GPUS, SHEETS, fromSheet, rate, peakFlops, streamed, link, hwPrecision,
    hardwareCheck,
  });
})();
