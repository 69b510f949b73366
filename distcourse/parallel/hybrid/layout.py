"""A hybrid layout: how many ranks go to data, pipeline and tensor parallelism.

8 ranks can be laid out as dp x pp x tp = 8x1x1 (pure data parallelism), 2x2x2,
1x1x8, ... The ranks form the grid `torch.arange(world).view(dp, pp, tp)`
(picotron's order, TP innermost: tensor-parallel partners are neighbouring ranks,
which on a real cluster share a node and its fast links). Each axis gets its own
process groups from `mesh.Mesh`. Everything a layout asks of the model and the
batch is checked here, before any group exists, so a bad layout is a ValueError
naming the degree on every rank instead of a hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from distcourse.arguments import positive_int
from distcourse.examples.gpt import GPTConfig
from distcourse.mesh import Mesh
from distcourse.runtime import DEFAULT_TIMEOUT, require_initialized

AXES = ("dp", "pp", "tp")  # outermost first: TP innermost


@dataclass(frozen=True)
class Layout:
    """Degrees of data (dp), pipeline (pp) and tensor (tp) parallelism."""

    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            positive_int(getattr(self, axis), axis)

    @property
    def world(self) -> int:
        """Ranks the layout needs: dp x pp x tp."""
        return self.dp * self.pp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dp, self.pp, self.tp)

    @property
    def name(self) -> str:
        """'dp x pp x tp' as the book writes it, e.g. '2x2x2'."""
        return "x".join(map(str, self.shape))

    def grid(self) -> list[list[list[int]]]:
        """Global rank at each (dp, pp, tp) coordinate, as nested lists."""
        n = iter(range(self.world))
        return [
            [[next(n) for _ in range(self.tp)] for _ in range(self.pp)]
            for _ in range(self.dp)
        ]


def layouts(world: int) -> list[Layout]:
    """Every layout of `world` ranks, pure data parallelism first."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    found = [
        Layout(dp, pp, world // (dp * pp))
        for dp in divisors
        for pp in divisors
        if (world // dp) % pp == 0
    ]
    return sorted(found, key=lambda lay: (-lay.dp, -lay.pp))


def check(
    layout: Layout,
    cfg: GPTConfig | None = None,
    world: int | None = None,
    *,
    batch: int | None = None,
    micro_batches: int = 1,
) -> None:
    """ValueError, naming the degree, if `layout` cannot train `cfg` on `world` ranks.

    The world must hold exactly dp x pp x tp ranks; the blocks must divide into pp
    stages; heads and vocabulary into tp slices; the batch into dp shares of
    `micro_batches` equal micro-batches. No message is sent. Without `cfg`, only
    the world and the batch are checked.
    """
    if world is not None and layout.world != world:
        raise ValueError(
            f"layout dp={layout.dp} x pp={layout.pp} x tp={layout.tp} = "
            f"{layout.world} ranks, but the world has {world}"
        )
    if cfg is not None and cfg.n_layer % layout.pp:
        raise ValueError(
            f"n_layer={cfg.n_layer} blocks do not divide into "
            f"pp={layout.pp} pipeline stages"
        )
    sizes = () if cfg is None else (("n_head", cfg.n_head), ("vocab", cfg.vocab))
    for name, value in sizes:
        if value % layout.tp:
            raise ValueError(f"{name}={value} is not divisible by tp={layout.tp}")
    positive_int(micro_batches, "micro_batches")
    if micro_batches > 1 and layout.pp == 1:
        raise ValueError(f"micro_batches={micro_batches} needs a pipeline: pp=1")
    if batch is not None:
        if batch % layout.dp:
            raise ValueError(
                f"a batch of {batch} does not split into dp={layout.dp} equal shares"
            )
        if (batch // layout.dp) % micro_batches:
            raise ValueError(
                f"a share of {batch // layout.dp} (batch {batch} / dp={layout.dp}) "
                f"does not split into {micro_batches} micro-batches"
            )


def make_mesh(
    layout: Layout, cfg: GPTConfig | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> Mesh:
    """The (dp, pp, tp) Mesh of this layout; a collective over the world.

    Checks the layout against the world (and against `cfg`, when given) first.
    """
    check(layout, cfg, require_initialized().world_size)
    return Mesh(layout.shape, AXES, timeout=timeout)
