"""Choosing dp x pp x tp for a model and a machine, from the package's formulas.

For every layout of the world the model admits, a row of the numbers that decide:

- memory per rank by kind (cost.parameters_held on the fullest stage): parameters
  and gradients 4 bytes each, AdamW's two moments 8 (float32 as the package
  trains; mixed precision's 2 + 2 + 12 is also 16); and the activations of the
  first stage under 1F1B, which holds p micro-batches of L / p blocks: L blocks of
  one micro-batch of one sequence, whatever p (Korthikanti et al. 2022, eq. 5:
  s b h (34 + 5 a s / h) / t bytes a block in 16 bits, with sequence parallelism);
- wire bytes per step along each axis (cost.bytes_per_step, the busiest stage),
  activations in the run's 16-bit type (`act_bytes`), gradients in float32;
- where each axis's groups run with the grid arange(world).view(dp, pp, tp) and
  nodes of consecutive ranks: tp inside a node while tp <= GPUs per node, pp while
  tp x pp is, dp only if the whole world is one node; and the seconds those bytes
  take at that link's speed (bandwidth only: no latency);
- the pipeline's bubble: (p - 1) micro-batches' compute, one sequence each, with
  the compute 6 N tokens FLOPs at `mfu` of the GPU's peak. Data parallelism's
  all-reduce hides behind backward without a pipeline (chapter 3's DDP) and waits
  for the pipeline's flush with one, so only then is it counted.

The rule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", takeaway 2): split the model (tp x pp) only as
far as memory needs, every remaining factor to data parallelism; among the splits
of that size, the fewest modelled seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from distcourse.examples.gpt import GPTConfig
from distcourse.parallel.hybrid.cost import FLOAT, bytes_per_step, parameters_held
from distcourse.parallel.hybrid.layout import Layout, check, layouts
from distcourse.tables import Table

GIB = 2**30


ACT_BYTES = 2  # bf16 activations, as mixed precision runs
MFU = 0.5  # share of the peak a step reaches (Narayanan et al. 2021: 44-52 %)


@dataclass(frozen=True)
class Machine:
    """Nodes of `gpus` GPUs with `memory_gb` GB (1e9 bytes) each; per GPU and
    direction, `node_gbs` GB/s to a GPU of its node and `network_gbs` GB/s to
    another node's; `tflops` the dense 16-bit peak (0: unknown, no bubble timed)."""

    name: str
    gpus: int
    memory_gb: float
    node_gbs: float
    network_gbs: float
    tflops: float = 0.0


# NVIDIA's H100 SXM datasheet: 80 GB, NVLink 900 GB/s (both directions together),
# 989 TFLOPS dense BF16; DGX H100: one 400 Gb/s ConnectX-7 (InfiniBand NDR) per
# GPU = 50 GB/s a direction
DGX_H100 = Machine(
    "DGX H100: 8 x H100 SXM, NVLink 4, NDR InfiniBand", 8, 80, 450, 50, 989
)


def links(layout: Layout, machine: Machine) -> dict[str, str]:
    """'node' or 'network': where each axis's groups run (TP innermost); '-' for
    an axis of degree 1, which sends nothing."""
    tp, pp = layout.tp, layout.pp
    where = dict(
        dp="node" if layout.world <= machine.gpus else "network",
        pp="node" if tp * pp <= machine.gpus else "network",
        tp="node" if tp <= machine.gpus else "network",
    )
    degree = dict(dp=layout.dp, pp=pp, tp=tp)
    return {axis: link if degree[axis] > 1 else "-" for axis, link in where.items()}


def activations(layout: Layout, cfg: GPTConfig, act_bytes: int = ACT_BYTES) -> int:
    """Bytes of activations on 1F1B's first stage: L blocks of one micro-batch of
    one sequence (Korthikanti et al. 2022, eq. 5, sequence parallelism, no
    recomputation: s h (34 + 5 a s / h) / t a block at 16 bits)."""
    s, h, a = cfg.block_size, cfg.n_embd, cfg.n_head
    per_block = s * h * (34 + 5 * a * s / h) / layout.tp * act_bytes / 2
    return int(cfg.n_layer * per_block)


def compute_seconds(cfg: GPTConfig, batch: int, world: int, machine: Machine) -> float:
    """A step's compute on each GPU: 6 N tokens FLOPs at MFU of the peak."""
    if machine.tflops <= 0:
        raise ValueError(f"{machine.name}: no tflops given, so no bubble can be timed")
    n = parameters_held(Layout(1, 1, 1), cfg, 0)
    return 6 * n * batch * cfg.block_size / (world * machine.tflops * 1e12 * MFU)


def row(layout: Layout, cfg: GPTConfig, batch: int, machine: Machine) -> dict:
    """The numbers of one layout: memory by kind (GiB), wire bytes and seconds per
    axis per step, the bubble's seconds, and whether it all fits a GPU."""
    stages = range(layout.pp)
    held = max(parameters_held(layout, cfg, s) for s in stages)
    memory = dict(params=FLOAT * held, grads=FLOAT * held, adamw=2 * FLOAT * held)
    memory["acts"] = activations(layout, cfg)
    sent = {
        axis: max(
            bytes_per_step(layout, cfg, batch, s, act_bytes=ACT_BYTES)[axis]
            for s in stages
        )
        for axis in ("dp", "pp", "tp")
    }
    where = links(layout, machine)
    speed = {"node": machine.node_gbs * 1e9, "network": machine.network_gbs * 1e9}
    speed["-"] = speed["node"]  # no bytes to time
    seconds = {axis: sent[axis] / speed[where[axis]] for axis in sent}
    compute = compute_seconds(cfg, batch, layout.world, machine)
    if layout.pp == 1:  # DDP's all-reduce hides behind backward (2/3 of compute)
        seconds["dp"] = max(0.0, seconds["dp"] - 2 / 3 * compute)
    micro_batches = batch // layout.dp  # one sequence each
    seconds["bubble"] = compute * (layout.pp - 1) / micro_batches
    return dict(
        layout=layout.name,
        memory_gib={k: v / GIB for k, v in memory.items()},
        state_gib=sum(memory.values()) / GIB,
        fits=sum(memory.values()) <= machine.memory_gb * 1e9,
        bytes=sent,
        links=where,
        seconds=seconds,
    )


def rows(cfg: GPTConfig, batch: int, world: int, machine: Machine) -> list[dict]:
    """A row per layout of `world` ranks that `cfg` and `batch` admit, with
    tp <= the GPUs of a node (TP across nodes never pays: chapter 4)."""
    found = []
    for layout in layouts(world):
        try:
            check(layout, cfg, world, batch=batch)
        except ValueError:
            continue
        if layout.tp <= machine.gpus:
            found.append(row(layout, cfg, batch, machine))
    return found


def choose(found: list[dict], rule: bool = True) -> dict:
    """The rule: of the rows whose memory fits, the least model parallelism (tp x
    pp), then the fewest modelled seconds; `rule=False`: the fewest seconds of all.
    ValueError if none fits: more GPUs, recomputation, or ZeRO / FSDP (chapter 9)."""
    fitting = [r for r in found if r["fits"]]
    if not fitting:
        raise ValueError(
            "no layout holds the model and its activations: more GPUs,"
            " recomputation, or shard the state"
        )

    def split(r: dict) -> tuple:
        _, pp, tp = (int(n) for n in r["layout"].split("x"))
        return (tp * pp if rule else 0, sum(r["seconds"].values()))

    return min(fitting, key=split)


def table(found: list[dict]) -> Table:
    """The rows as a table: memory (GiB), then per axis MB, link and ms, the
    bubble's ms and all the modelled ms of a step. Printed it is aligned text; a
    notebook shows it as an HTML table (`tables.Table`)."""
    axes = ("dp", "pp", "tp")  # headers kept short: the book's column is 936 px
    header = ["layout", "state", "acts", "fits"]
    header += [what for a in axes for what in (f"{a} MB", "link", "ms")]
    short = {"node": "node", "network": "net", "-": "-"}
    rows = []
    for r in found:
        m, sec = r["memory_gib"], r["seconds"]
        row = [r["layout"], f"{r['state_gib'] - m['acts']:.1f}", f"{m['acts']:.1f}"]
        row.append(str(r["fits"]))
        for a in axes:
            row += [f"{r['bytes'][a] / 1e6:,.0f}", short[r["links"][a]]]
            row.append(f"{1e3 * sec[a]:,.0f}")
        row += [f"{1e3 * sec['bubble']:,.0f}", f"{1e3 * sum(sec.values()):,.0f}"]
        rows.append(row)
    header += ["bubble", "total"]
    units = "state, acts: GiB a GPU; each axis: MB a step, its link, ms; "
    units += "bubble, total: ms"
    return Table(header, rows, align=">>>>" + ">>>" * len(axes) + ">>", caption=units)


def summary(best: dict) -> str:
    """A chosen row in one line: its layout, state per GPU and each axis's link."""
    where = ", ".join(f"{axis} {link}" for axis, link in best["links"].items())
    memory = f"{best['state_gib']:.1f} GiB per GPU with activations"
    return f"choose {best['layout']}: {memory}; {where}"
