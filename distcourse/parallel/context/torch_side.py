"""PyTorch's own context parallelism, `torch.distributed.tensor.experimental.
context_parallel`, run beside ours.

`with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):` shards
the given tensors in place along their sequence dimension (by default with its
head-tail load balancer: rank r keeps chunks r and 2·cp − 1 − r, our "zigzag"), and
inside the block `F.scaled_dot_product_attention` becomes a ring attention over the
mesh. That second part is written only for the CUDA kernels: it replaces
`_scaled_dot_product_flash_attention`, `_efficient_attention` and
`_cudnn_attention`. On CPU, SDPA calls `_scaled_dot_product_flash_attention_for_cpu`,
for which DTensor has no rule (torch 2.14: NotImplementedError, "does not have a
sharding strategy registered"); forcing the math kernel instead mixes plain tensors
and DTensors (RuntimeError). So on gloo CPU ranks its split runs and its attention
does not; `attention` returns the error's text there, and the output on a GPU.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.experimental import context_parallel

from distcourse.comm.agree import Group


def _mesh(group: Group, x: Tensor) -> DeviceMesh:
    return DeviceMesh.from_group(group or dist.group.WORLD, x.device.type)


def shard(x: Tensor, dim: int, group: Group = None) -> Tensor:
    """This rank's piece of the whole `x` as torch's context_parallel cuts it."""
    buffer = x.clone()
    with context_parallel(_mesh(group, x), buffers=[buffer], buffer_seq_dims=[dim]):
        return buffer.clone()


def attention(
    q: Tensor, k: Tensor, v: Tensor, group: Group = None, *, causal: bool = True
) -> Tensor | str:
    """torch's ring attention of the whole q, k, v (B, H, T, D): this rank's rows of
    the output in its head-tail order, or, where it cannot run, the error it raised
    ('NotImplementedError: ...')."""
    q, k, v = (t.clone() for t in (q, k, v))
    try:
        with context_parallel(
            _mesh(group, q), buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]
        ):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    except (NotImplementedError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
