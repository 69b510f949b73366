"""PyTorch's own context parallelism, `torch.distributed.tensor.experimental.
context_parallel`, run beside ours.

`with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):` shards
the given tensors in place along their sequence dimension (by default with its
head-tail load balancer: rank r keeps chunks r and 2·cp − 1 − r, our "zigzag"), and
inside the block `F.scaled_dot_product_attention` is dispatched to its context-
parallel attention. What that does, read from torch 2.14.1
(torch/distributed/tensor/experimental/_context_parallel/_attention.py):

- K/V are not passed round by default: `_ContextParallelOptions.rotate_method` is
  ALL_GATHER, whose rotater all-gathers K/V once ("Only one communication will be
  done") and hands out one rank's chunk per step; `set_rotate_method("alltoall")`
  (in `torch.distributed.tensor.experimental._attention`) passes them to the next
  rank each step, as our ring does. In the backward, K/V come the same way and
  dK/dV always go round the ring (`_create_rotater(..., method=ALL_TO_ALL)`).
- Its load balancer (on by default) requires a causal mask: forward and backward
  raise RuntimeError("Load balancing requires `is_causal=True`.") otherwise, so
  the non-causal attention our chapter checks fails under torch's defaults.
- It is written for the CUDA kernels: it replaces
  `_scaled_dot_product_flash_attention`, `_efficient_attention` and
  `_cudnn_attention`. On CPU, SDPA calls `_scaled_dot_product_flash_attention_for_
  cpu`, for which DTensor has no rule (NotImplementedError, "does not have a
  sharding strategy registered"); forcing the math kernel instead mixes plain
  tensors and DTensors (RuntimeError). So on gloo CPU ranks its split runs and its
  attention does not; `attention` returns the error's text there, and the output
  on a GPU.
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
    """torch's context-parallel attention of the whole q, k, v (B, H, T, D), with its
    defaults (all-gathered K/V, head-tail balance): this rank's rows of
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
