"""Choosing dp x pp x tp for a model and a machine, from the package's formulas.

For every layout of the world the model admits, a row of the numbers that decide:

- memory per rank by kind (cost.parameters_held on the fullest stage): parameters
  and gradients 4 bytes each, AdamW's two moments 8, in float32 as the package
  trains; activations come on top (measured by HybridGPT.held, not modelled here);
- wire bytes per step along each axis (cost.bytes_per_step, the busiest stage);
- where each axis's groups run with the grid arange(world).view(dp, pp, tp) and
  nodes of consecutive ranks: tp inside a node while tp <= GPUs per node, pp while
  tp x pp is, dp only if the whole world is one node; and the seconds those bytes
  take at that link's speed (bandwidth only: no latency, no overlap).

The rule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", takeaways 1-3): split the model (tp x pp) only
as far as memory needs; tp up to the GPUs of one node, pipeline stages across
nodes beyond it; every remaining factor to data parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from distcourse.examples.gpt import GPTConfig
from distcourse.parallel.hybrid.cost import FLOAT, bytes_per_step, parameters_held
from distcourse.parallel.hybrid.layout import Layout, check, layouts

GIB = 2**30


@dataclass(frozen=True)
class Machine:
    """Nodes of `gpus` GPUs with `memory_gib` each; per GPU and direction, `node_gbs`
    GB/s to a GPU of its node and `network_gbs` GB/s to another node's."""

    name: str
    gpus: int
    memory_gib: float
    node_gbs: float
    network_gbs: float


# NVIDIA's H100 SXM datasheet: 80 GB, NVLink 900 GB/s (both directions together);
# DGX H100: one 400 Gb/s ConnectX-7 (InfiniBand NDR) per GPU = 50 GB/s a direction
DGX_H100 = Machine("DGX H100: 8 x H100 SXM, NVLink 4, NDR InfiniBand", 8, 80, 450, 50)


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


def row(layout: Layout, cfg: GPTConfig, batch: int, machine: Machine) -> dict:
    """The numbers of one layout: memory by kind (GiB), wire bytes and seconds per
    axis per step, and whether the model state fits a GPU."""
    stages = range(layout.pp)
    held = max(parameters_held(layout, cfg, s) for s in stages)
    memory = dict(params=FLOAT * held, grads=FLOAT * held, adamw=2 * FLOAT * held)
    sent = {
        axis: max(bytes_per_step(layout, cfg, batch, s)[axis] for s in stages)
        for axis in ("dp", "pp", "tp")
    }
    where = links(layout, machine)
    speed = {"node": machine.node_gbs * 1e9, "network": machine.network_gbs * 1e9}
    speed["-"] = speed["node"]  # no bytes to time
    seconds = {axis: sent[axis] / speed[where[axis]] for axis in sent}
    return dict(
        layout=layout.name,
        memory_gib={k: v / GIB for k, v in memory.items()},
        state_gib=sum(memory.values()) / GIB,
        fits=sum(memory.values()) <= machine.memory_gib * GIB,
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


def choose(found: list[dict]) -> dict:
    """The rule: of the rows whose state fits, the least model parallelism (tp x pp,
    then tp before pp), then the fewest communication seconds. ValueError if none
    fits: the model needs more GPUs, or ZeRO / FSDP (chapter 9)."""
    fitting = [r for r in found if r["fits"]]
    if not fitting:
        raise ValueError("no layout holds the model state: more GPUs, or shard it")

    def split(r: dict) -> tuple:
        _, pp, tp = (int(n) for n in r["layout"].split("x"))
        return (tp * pp, pp, sum(r["seconds"].values()))

    return min(fitting, key=split)


def table(found: list[dict]) -> str:
    """The rows as text: memory by kind, then per axis bytes (MB), link, ms."""
    lines = [
        f"{'layout':>8} {'params':>7} {'grads':>7} {'adamw':>7} {'fits':>5}  "
        + "  ".join(f"{a + ' MB, link, ms':>24}" for a in ("dp", "pp", "tp"))
    ]
    for r in found:
        m = r["memory_gib"]
        axes = "  ".join(
            f"{r['bytes'][a] / 1e6:>9,.0f} {r['links'][a]:>7} "
            f"{1e3 * r['seconds'][a]:>6,.0f}"
            for a in ("dp", "pp", "tp")
        )
        lines.append(
            f"{r['layout']:>8} {m['params']:>6.1f}G {m['grads']:>6.1f}G "
            f"{m['adamw']:>6.1f}G {str(r['fits']):>5}  {axes}"
        )
    return "\n".join(lines)


def summary(best: dict) -> str:
    """A chosen row in one line: its layout, state per GPU and each axis's link."""
    where = ", ".join(f"{axis} {link}" for axis, link in best["links"].items())
    return (
        f"choose {best['layout']}: state {best['state_gib']:.1f} GiB per GPU; {where}"
    )
