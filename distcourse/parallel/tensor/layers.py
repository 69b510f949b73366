"""Column- and row-parallel linear layers: one nn.Linear's weight split across ranks.

nn.Linear computes y = x W^T + b with W of shape (out, in). Split W by rows (output
features) and each rank computes its own slice of y from the whole x:
ColumnParallelLinear. Split W by columns (input features) and each rank computes a
partial y from its slice of x; the sum over ranks is y: RowParallelLinear. A column
layer followed by a row layer needs no message in between (Megatron's MLP).

The messages sit at the edges, as the conjugate operators of comm.autograd:

    ColumnParallelLinear  input: copy_to_group (f)      identity fwd, all_reduce bwd
    RowParallelLinear     output: reduce_from_group (g) all_reduce fwd, identity bwd

With `sequence_parallel=True` the activations outside the layers are split along the
sequence (`seq_dim`), and f / g become all_gather_along / reduce_scatter_along: the
same bytes on a ring, and the norms and dropouts between blocks work on 1/N of the
tokens. Sizes are checked when a layer is built (out_features % N, a ValueError
naming both numbers) and each forward agrees on shapes across ranks first
(`check=True`: one all_gather of 112 bytes), so bad input is an error on every rank;
the messages after that go unchecked (`edges`). Conversions to and from nn.Linear and
full state dicts are in `checkpoint`.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.types import Device

from distcourse.comm.agree import Group, Members, agree, agree_lengths, members
from distcourse.parallel.tensor import edges
from distcourse.parallel.tensor.checkpoint import ShardedLinear, check_keys


class ColumnParallelLinear(ShardedLinear):
    """y = x W^T + b with W's rows (output features) split across the ranks of `group`.

    Input: the whole x (B, ..., in_features), replicated; or, with sequence_parallel,
    this rank's part of the sequence along `seq_dim`. Output: this rank's
    out_features / N features, or all of them with `gather_output=True`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        gather_output: bool = False,
        **options: Unpack[SplitOptions],
    ) -> None:
        super().__init__()
        rows, made = split(self, "out_features", out_features, options)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.weight = nn.Parameter(torch.empty(rows, in_features, **made))
        self.bias = nn.Parameter(torch.empty(rows, **made)) if bias else None
        _init(self.weight, self.bias, in_features)

    def enter(self, x: Tensor) -> Tensor:
        """The input's way in: Megatron's f, or all_gather_along with sequence_parallel.

        Agrees on x's shape across ranks first (with `check`), so a mismatch raises
        on every rank. ParallelSelfAttention calls this once for query, key and value.
        """
        tp, d = self.tp, self.seq_dim

        def input_fits() -> int:
            if x.dim() < 1 or x.shape[-1] != self.in_features:
                raise ValueError(
                    f"ColumnParallelLinear: input of shape {list(x.shape)}, expected "
                    f"(..., in_features={self.in_features})"
                )
            if self.sequence_parallel and not -x.dim() <= d < x.dim() - 1:
                raise ValueError(
                    f"ColumnParallelLinear: seq_dim={d} is not a "
                    f"sequence dim of a {x.dim()}-d input"
                )
            return -1

        name = "ColumnParallelLinear"
        if self.sequence_parallel:  # parts may differ in length: the check brings them
            _, sizes = agree_lengths(
                name, x, d, tp.group, validate=input_fits, check=self.check
            )
            return edges.gather_sequence(x, d, tp.group, sizes)
        agree(name, x, tp.group, validate=input_fits, check=self.check)
        return edges.f(x, tp.group)

    def local(self, x: Tensor) -> Tensor:
        """This rank's output features of x, no messages: x has been through `enter`."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = self.local(self.enter(x))  # (..., out_features / N)
        if self.gather_output:  # (..., out_features), the same on every rank
            return edges.gather(y, -1, self.tp.group)
        return y

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole layer's weight (and bias), gathered: a collective of the group."""
        with torch.no_grad():
            return {
                k: edges.gather(v.detach(), 0, self.tp.group)
                for k, v in self.state_dict().items()
            }

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        """Keep this rank's rows of a full state dict (no messages)."""
        n, r = self.tp.size, self.tp.rank
        shapes = self.full_shapes()
        check_keys("ColumnParallelLinear", state, shapes)
        with torch.no_grad():
            for key, param in self.state_dict(keep_vars=True).items():
                param.copy_(state[key].chunk(n, 0)[r])

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"({self.weight.shape[0]} on this rank of {self.tp.size}), "
            f"gather_output={self.gather_output}, "
            f"sequence_parallel={self.sequence_parallel}"
        )


class RowParallelLinear(ShardedLinear):
    """y = x W^T + b with W's columns (input features) split across the ranks.

    Input: this rank's in_features / N features (a ColumnParallelLinear's output), or
    the whole x with `input_is_parallel=False` (each rank keeps its slice). The
    partial products are summed over ranks (g), then the bias is added once. With
    sequence_parallel the sum is a reduce_scatter: this rank keeps its part of the
    sequence.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        input_is_parallel: bool = True,
        **options: Unpack[SplitOptions],
    ) -> None:
        super().__init__()
        cols, made = split(self, "in_features", in_features, options)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, cols, **made))
        full = torch.empty(out_features, **made)  # added once, after the sum
        self.bias = nn.Parameter(full) if bias else None
        _init(self.weight, self.bias, in_features)

    def _check_input(self, x: Tensor) -> None:
        """Agree on x's shape across ranks; a full input where a slice belongs is an
        error on every rank (the commonest mistake: input_is_parallel left True)."""
        tp, mine = self.tp, self.weight.shape[1]

        def input_fits() -> int:
            want = mine if self.input_is_parallel else self.in_features
            if x.dim() >= 1 and x.shape[-1] == want:
                return -1
            full = x.dim() >= 1 and x.shape[-1] == self.in_features
            if self.input_is_parallel and tp.size > 1 and full:
                raise ValueError(
                    f"RowParallelLinear was fed a full input ({self.in_features} "
                    f"features): with input_is_parallel=True each rank takes its slice "
                    f"of {mine}; split it, or build the layer with "
                    "input_is_parallel=False"
                )
            raise ValueError(
                f"RowParallelLinear: input of shape {list(x.shape)}, expected "
                f"(..., {want}) ({'this rank' if self.input_is_parallel else 'all'} of "
                f"in_features={self.in_features})"
            )

        agree("RowParallelLinear", x, tp.group, validate=input_fits, check=self.check)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        group = self.tp.group
        if not self.input_is_parallel:
            x = edges.split(x, -1, group)  # (..., in_features / N)
        partial = F.linear(x, self.weight)  # (..., out_features), summed next
        if not self.sequence_parallel:
            y = edges.g(partial, group)
            return y if self.bias is None else y + self.bias
        y = edges.scatter_sequence(partial, self.seq_dim, group)
        if self.bias is None:
            return y
        return y + edges.f(self.bias, group)  # used on my tokens

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole layer's weight gathered along columns (a collective), and bias."""
        with torch.no_grad():
            w = edges.gather(self.weight.detach(), 1, self.tp.group)
            state = {"weight": w}
            if self.bias is not None:
                state["bias"] = self.bias.detach().clone()
            return state

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        """Keep this rank's columns of a full state dict (no messages)."""
        shapes = self.full_shapes()
        check_keys("RowParallelLinear", state, shapes)
        with torch.no_grad():
            self.weight.copy_(state["weight"].chunk(self.tp.size, 1)[self.tp.rank])
            if self.bias is not None:
                self.bias.copy_(state["bias"])

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} ({self.weight.shape[1]} on this rank "
            f"of {self.tp.size}), out_features={self.out_features}, "
            f"input_is_parallel={self.input_is_parallel}, "
            f"sequence_parallel={self.sequence_parallel}"
        )


class SplitOptions(TypedDict, total=False):
    """The keyword arguments every split layer takes beside its own: the group
    (None: the world), sequence parallelism and the sequence's dim, the shape
    agreement before each forward, and torch's factory arguments (`dtype`, `device`)
    for the slice it holds."""

    group: Group
    sequence_parallel: bool
    seq_dim: int
    check: bool
    dtype: torch.dtype | None
    device: Device


SPLIT_DEFAULTS = SplitOptions(
    group=None, sequence_parallel=False, seq_dim=1, check=True, dtype=None, device=None
)


def split(
    layer: nn.Module, name: str, value: int, options: SplitOptions
) -> tuple[int, dict[str, Any]]:
    """Give a split layer what `options` say (its `tp` members, `sequence_parallel`,
    `seq_dim`, `check`); return its share of `value` (the size it splits, called
    `name` in the error when it does not divide) and the factory arguments."""
    kind = type(layer).__name__
    unknown = sorted(set(options) - set(SPLIT_DEFAULTS))
    if unknown:
        raise TypeError(f"{kind}() got an unexpected keyword argument {unknown[0]!r}")
    given = {**SPLIT_DEFAULTS, **options}
    layer.tp = members(given["group"], kind)
    layer.sequence_parallel = given["sequence_parallel"]
    layer.seq_dim, layer.check = given["seq_dim"], given["check"]
    made = dict(dtype=given["dtype"], device=given["device"])
    return shard_size(name, value, layer.tp), made


def shard_size(name: str, value: int, g: Members) -> int:
    """value / tensor-parallel size, or a ValueError naming both numbers."""
    if value % g.size:
        raise ValueError(
            f"{name}={value} is not divisible by tensor-parallel size {g.size}"
        )
    return value // g.size


def _init(weight: Tensor, bias: Tensor | None, fan_in: int) -> None:
    """nn.Linear's initialisation, bounds from the full layer's fan-in."""
    bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias.uniform_(-bound, bound)
