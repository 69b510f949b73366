"""TinyGPT with ring attention, trained dp x cp on a 2-D mesh against one process.

Context parallelism touches only the parts of a model that mix tokens. Embeddings,
norms, MLPs and the head act on each token alone, so a rank runs them unchanged on
its T/cp tokens; attention becomes `ring_attention`; and the position embedding must
be looked up at the tokens' *global* positions (`split.positions`): under the
zig-zag split, rank 0 holds tokens 0..c−1 and T−c..T−1, not 0..T/cp−1.

On a (dp, cp) mesh (`make_mesh`, cp innermost) the dp coordinate picks a share of
the batch's sequences and the cp coordinate a share of each sequence's tokens. Each
rank's loss is the mean over its B/dp x T/cp tokens, 1/(dp·cp) of all of them,
so one process's loss (the mean over all tokens) is the average of the ranks'
losses, and its gradient the average of their gradients: an all-reduce over the cp
group and one over the dp group, then division by dp·cp (`average_gradients`).
Forget the cp all-reduce and the two cp ranks of a sequence step with different
halves of its gradient; sum over dp instead of averaging and the step is dp times
too long: `against_one_process` sees either.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import checks, runtime
from distcourse.comm.agree import Group, members
from distcourse.comm.ledger import ring_wire_bytes
from distcourse.examples.gpt import GPTConfig, SelfAttention, TinyGPT, lm_loss
from distcourse.mesh import Mesh
from distcourse.parallel.context.cost import ring_bytes
from distcourse.parallel.context.ring import ring_attention
from distcourse.parallel.context.split import check_layout, check_sequence, positions
from distcourse.parallel.context.split import shard as shard_tokens

Batch = tuple[Tensor, Tensor]  # (tokens, next tokens), each (B, T)


class RingSelfAttention(nn.Module):
    """`examples.gpt.SelfAttention`'s own layers, attending by ring over `group`."""

    def __init__(self, attn: SelfAttention, group: Group, layout: str) -> None:
        super().__init__()
        self.head_dim, self.group, self.layout = attn.head_dim, group, layout
        self.query, self.key, self.value = attn.query, attn.key, attn.value
        self.proj, self.drop = attn.proj, attn.drop

    def forward(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape  # L = T / cp: this rank's tokens
        q, k, v = (
            f(x).view(B, L, -1, self.head_dim).transpose(1, 2)  # (B, H, L, hd)
            for f in (self.query, self.key, self.value)
        )
        y = ring_attention(q, k, v, self.group, layout=self.layout, check=False)
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, L, -1)))


class ContextGPT(nn.Module):
    """A TinyGPT whose attention runs by ring over `group`; `forward(idx)` takes this
    rank's tokens (B, T/cp), in `layout`'s order, and gives their logits."""

    def __init__(self, model: TinyGPT, group: Group, layout: str = "zigzag") -> None:
        super().__init__()
        self.layout, self.group = check_layout(layout), group
        self.cp = members(group, "ContextGPT").size
        for block in model.blocks:  # in place: the parameters stay the model's own
            block.attn = RingSelfAttention(block.attn, group, layout)
        self.model = model

    def token_positions(self, local: int) -> Tensor:
        """The global positions of this rank's `local` tokens."""
        g = members(self.group, "ContextGPT")
        return positions(local * self.cp, self.cp, g.rank, self.layout)

    def forward(self, idx: Tensor) -> Tensor:
        m, T = self.model, idx.shape[1] * self.cp
        if T > m.cfg.block_size:
            raise ValueError(f"{T} tokens > block_size={m.cfg.block_size}")
        check_sequence(T, self.cp)
        pos = self.token_positions(idx.shape[1]).to(idx.device)
        x = m.drop(m.tok(idx) + m.pos(pos))  # (B, T/cp, C)
        for block in m.blocks:
            x = block(x)
        return m.head(m.ln_f(x))


def make_mesh(cp: int, world: int | None = None) -> Mesh:
    """The (dp, cp) mesh of the world, cp innermost; ValueError before any group if
    cp does not divide the world."""
    world = dist.get_world_size() if world is None else world
    if not isinstance(cp, int) or cp < 1 or world % cp:
        raise ValueError(f"cp={cp!r} does not divide the world of {world} ranks")
    return Mesh((world // cp, cp), ("dp", "cp"))


def local_batch(batch: Batch, mesh: Mesh, layout: str = "zigzag") -> Batch:
    """This rank's part of a whole batch: its dp share of the sequences, its cp
    share of their tokens. ValueError if either does not split."""
    dp, cp = mesh.size("dp"), mesh.size("cp")
    where = mesh.coordinate
    out = []
    for t in batch:
        if t.shape[0] % dp:
            raise ValueError(f"a batch of {t.shape[0]} does not split into dp={dp}")
        rows = t.chunk(dp, 0)[where["dp"]]
        out.append(shard_tokens(rows, 1, cp, where["cp"], layout))
    return out[0], out[1]


def average_gradients(model: nn.Module, mesh: Mesh) -> None:
    """Sum every gradient over the cp group and the dp group, divide by dp·cp."""
    n = mesh.size("dp") * mesh.size("cp")
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=mesh.group("cp"))
            dist.all_reduce(p.grad, group=mesh.group("dp"))
            p.grad /= n


def step_bytes(model: ContextGPT, batch_shape: tuple[int, int], mesh: Mesh) -> int:
    """Wire bytes one rank sends in a training step of `model` on a whole batch of
    `batch_shape` (B, T): each block's ring attention (its agreement check off),
    then every gradient all-reduced over cp and over dp (2(n − 1)/n of its bytes
    on a ring of n, per tensor)."""
    B, T = batch_shape
    dp, cp = mesh.size("dp"), mesh.size("cp")
    cfg = model.model.cfg
    kv = (B // dp) * (T // cp) * cfg.n_embd * 4  # this rank's K, every head, fp32
    total = cfg.n_layer * ring_bytes(kv, cp, check=False)
    for p in model.parameters():
        size = p.numel() * p.element_size()
        total += sum(ring_wire_bytes("all_reduce", size, n) for n in (cp, dp))
    return total


Reduce = Callable[[nn.Module, Mesh], None]


def train_dp_cp(
    model: ContextGPT,
    batches: list[Batch],
    mesh: Mesh,
    *,
    lr: float = 0.1,
    reduce: Reduce | None = None,
) -> tuple[list[float], dict[str, Tensor]]:
    """Plain SGD on the whole batches, each rank on its part; (this rank's losses,
    the first step's gradients by parameter name). `reduce` (default this module's
    `average_gradients`, looked up when it runs) averages the gradients."""
    reduce = reduce or average_gradients
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, first = [], {}
    for x, y in batches:
        xs, ys = local_batch((x, y), mesh, model.layout)
        opt.zero_grad()
        loss = lm_loss(model(xs), ys)
        loss.backward()
        reduce(model, mesh)
        if not first:
            first = {n: p.grad.clone() for n, p in model.model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first


def train_one_process(
    model: TinyGPT, batches: list[Batch], *, lr: float = 0.1
) -> dict[str, Tensor]:
    """The reference: the same SGD on whole batches; the first step's gradients."""
    opt, first = torch.optim.SGD(model.parameters(), lr=lr), {}
    for x, y in batches:
        opt.zero_grad()
        lm_loss(model(x), y).backward()
        if not first:
            first = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return first


def against_one_process(
    mesh: Mesh,
    cfg: GPTConfig,
    batches: list[Batch],
    *,
    layout: str = "zigzag",
    reduce: Reduce | None = None,
    wrap: Callable[[TinyGPT, Group, str], ContextGPT] | None = None,
) -> tuple[float, float]:
    """(step-1 gradients, parameters after every step): the largest difference
    between the dp x cp run and one process, over every tensor and every rank.

    Both start from TinyGPT(cfg) under seed 0, on the rank's device. `reduce` and
    `wrap` are the gradient reduction and the model wrapper (default this module's
    `average_gradients` and `ContextGPT`, looked up when it runs).
    """
    wrap = wrap or ContextGPT
    device = runtime.device()
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    torch.manual_seed(0)
    one = TinyGPT(cfg).to(device)
    torch.manual_seed(0)
    ours = wrap(TinyGPT(cfg).to(device), mesh.group("cp"), layout)
    ref_grads = train_one_process(one, batches)
    _, grads = train_dp_cp(ours, batches, mesh, reduce=reduce)
    ref = dict(one.named_parameters())
    grad = max((grads[n] - ref_grads[n]).abs().max().item() for n in grads)
    param = max(
        (p - ref[n]).abs().max().item() for n, p in ours.model.named_parameters()
    )
    return checks.max_over_ranks(grad), checks.max_over_ranks(param)
