"""A hybrid layout: how many ranks go to data, pipeline, tensor, expert and
context parallelism.

8 ranks can be laid out as dp x pp x tp = 8x1x1 (pure data parallelism), 2x2x2,
1x1x8, ... The ranks form the grid `torch.arange(world).view(dp, pp, tp)`
(picotron's order, TP innermost: tensor-parallel partners are neighbouring ranks,
which on a real cluster share a node and its fast links). Each axis gets its own
process groups from `mesh.Mesh`. Everything a layout asks of the model and the
batch is checked here, before any group exists, so a bad layout is a ValueError
naming the degree on every rank instead of a hang.

Chapter 12 adds two axes, 1 by default (so every chapter-8 layout is unchanged):
`ep` (expert parallelism: the experts of each MoE layer split across ep ranks,
which also hold different tokens, so the batch splits over dp x ep) and `cp`
(context parallelism: each sequence split across cp ranks, zig-zag, so its length
must split into 2 x cp chunks). The full grid, outermost first, is
(dp, pp, ep, cp, tp): `ALL_AXES`; a mesh gets the axes whose degree is above 1
beside the three of chapter 8 (`Layout.axes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from distcourse.arguments import positive_int
from distcourse.examples.gpt import GPTConfig
from distcourse.mesh import Mesh
from distcourse.runtime import DEFAULT_TIMEOUT, require_initialized

AXES = ("dp", "pp", "tp")  # outermost first: TP innermost
ALL_AXES = ("dp", "pp", "ep", "cp", "tp")  # with chapter 12's two axes


@dataclass(frozen=True)
class Layout:
    """Degrees of data (dp), pipeline (pp), tensor (tp), expert (ep) and context
    (cp) parallelism; ep and cp default to 1 (chapter 8's three axes)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    ep: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for axis in ALL_AXES:
            positive_int(getattr(self, axis), axis)

    @property
    def world(self) -> int:
        """Ranks the layout needs: dp x pp x ep x cp x tp."""
        return self.dp * self.pp * self.ep * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        """(dp, pp, tp): chapter 8's grid (see `axes` for all five)."""
        return (self.dp, self.pp, self.tp)

    @property
    def axes(self) -> tuple[tuple[str, int], ...]:
        """(name, degree) of the mesh's axes, outermost first: dp, pp and tp
        always, ep and cp where their degree is above 1."""
        return tuple(
            (axis, getattr(self, axis))
            for axis in ALL_AXES
            if axis in AXES or getattr(self, axis) > 1
        )

    @property
    def name(self) -> str:
        """'dp x pp x tp' as the book writes it, e.g. '2x2x2'; ep and cp above 1
        follow as '2x1x1 ep2', '2x1x1 cp2'."""
        extra = [f"{a}{getattr(self, a)}" for a in ("ep", "cp") if getattr(self, a) > 1]
        return " ".join(["x".join(map(str, self.shape)), *extra])

    def grid(self) -> list[list[list[int]]]:
        """Global rank at each (dp, pp, tp) coordinate, as nested lists (a layout
        with ep or cp above 1: see `axes`, and `torch.arange(world).view(...)`)."""
        if self.ep * self.cp > 1:
            raise ValueError(f"grid() draws dp x pp x tp; {self.name} has more axes")
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
    experts: int | None = None,
    seq_len: int | None = None,
) -> None:
    """ValueError, naming the degree, if `layout` cannot train `cfg` on `world` ranks.

    The world must hold exactly dp x pp x tp ranks; the blocks must divide into pp
    stages; heads and vocabulary into tp slices; the batch into dp shares of
    `micro_batches` equal micro-batches (dp x ep shares: expert-parallel ranks hold
    different tokens); `experts` (per MoE layer) into ep groups; a sequence of
    `seq_len` tokens into 2 x cp zig-zag chunks. No message is sent. Without
    `cfg`, only the world, the batch, the experts and the sequence are checked.
    """
    if world is not None and layout.world != world:
        degrees = " x ".join(f"{a}={d}" for a, d in layout.axes)
        raise ValueError(
            f"layout {degrees} = {layout.world} ranks, but the world has {world}"
        )
    if experts is not None and positive_int(experts, "experts") % layout.ep:
        raise ValueError(f"experts={experts} is not divisible by ep={layout.ep}")
    if seq_len is not None and positive_int(seq_len, "seq_len") % (2 * layout.cp):
        raise ValueError(
            f"a sequence of {seq_len} tokens does not split into 2 x cp="
            f"{2 * layout.cp} zig-zag chunks"
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
        shares = layout.dp * layout.ep
        who = f"dp={layout.dp}" + (f" x ep={layout.ep}" if layout.ep > 1 else "")
        if batch % shares:
            raise ValueError(
                f"a batch of {batch} does not split into {who} equal shares"
            )
        if (batch // shares) % micro_batches:
            raise ValueError(
                f"a share of {batch // shares} (batch {batch} / {who}) "
                f"does not split into {micro_batches} micro-batches"
            )


def make_mesh(
    layout: Layout, cfg: GPTConfig | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> Mesh:
    """The (dp, pp, [ep, cp,] tp) Mesh of this layout; a collective over the world.

    Checks the layout against the world (and against `cfg`, when given) first.
    """
    check(layout, cfg, require_initialized().world_size)
    names = tuple(axis for axis, _ in layout.axes)
    return Mesh(tuple(degree for _, degree in layout.axes), names, timeout=timeout)
