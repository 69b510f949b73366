"""Mixed precision: bf16 weights and compute, fp32 master weights and optimizer.

`MixedPrecision` is the recipe of Micikevicius et al. 2018 that the ZeRO paper
counts (its section 3.1): the model runs forward and backward with bf16 weights
under `torch.autocast` (ops that need the range, like the loss, run in fp32), so its
gradients arrive in bf16; they are averaged over the group in `reduce_dtype`, in
one flat bucket (fp32 is the safe choice, bf16 halves the bytes sent), land on an
fp32 copy of the weights (the master), AdamW steps the master, and the master is
rounded back into the bf16 weights. Bytes per parameter:

    bf16 weights 2 + bf16 gradients 2 + fp32 master 4 + AdamW's moments 8 = 16

the same 16 as plain fp32 (4 + 4 + 8): mixed precision halves the activations and
speeds up the matrix products, not the model's state. With `param_dtype=float32`
the same class is plain fp32 training (the weights are their own master); with
`master=False`, AdamW steps the bf16 weights themselves (its moments in bf16 too):
the shortcut whose updates, below bf16's spacing, are rounded away.

torch's everyday form, autocast over an fp32 model, keeps 4 + 4 + 8 as well, and
casts a bf16 copy of each weight as the forward uses it (kept for backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.agree import Group

FP32, BF16 = torch.float32, torch.bfloat16
ADAMW_STEP = 4  # bytes: AdamW's step counter, a float32 scalar per tensor


class MixedPrecision:
    """Train `model` with `param_dtype` weights, fp32 master weights and AdamW;
    gradients averaged over `group` (None: the default group; one process: none
    is sent) in `reduce_dtype`.

    `model` must hold fp32 weights: they become the master, then the model's own
    are cast to `param_dtype`. Call `step(loss_of)` with a function from the model
    to a scalar loss; it returns the loss this rank computed.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float = 1e-2,
        group: Group = None,
        *,
        param_dtype: torch.dtype = BF16,
        reduce_dtype: torch.dtype = FP32,
        master: bool = True,
    ) -> None:
        params = list(model.parameters())
        wrong = {p.dtype for p in params} - {FP32}
        if wrong:
            raise ValueError(f"model must hold float32 weights, found {wrong}")
        if param_dtype not in (FP32, BF16) or reduce_dtype not in (FP32, BF16):
            raise ValueError("param_dtype and reduce_dtype: float32 or bfloat16")
        self.model, self.group = model, group
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        if param_dtype == FP32 or not master:
            model.to(param_dtype)
            self.master = list(model.parameters())  # the weights are their own
        else:
            self.master = [p.detach().clone() for p in params]
            model.to(param_dtype)
        self.params = list(model.parameters())
        self.optimizer = torch.optim.AdamW(self.master, lr=lr)

    def step(self, loss_of: Callable[[nn.Module], Tensor]) -> float:
        """One forward and backward under autocast, the gradients averaged, one
        AdamW step on the master, the weights refreshed from it."""
        for p in self.params:
            p.grad = None
        device_type = self.params[0].device.type
        enabled = self.param_dtype != FP32
        with torch.autocast(device_type, dtype=self.param_dtype, enabled=enabled):
            loss = loss_of(self.model)
        loss.backward()
        world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        # one flat bucket in the reduce dtype, one all_reduce (as DDP's buckets)
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        flat = flat.to(self.reduce_dtype)
        if world > 1:
            dist.all_reduce(flat, group=self.group)
        flat /= world
        pieces = flat.split([p.numel() for p in self.params])
        for p, m, piece in zip(self.params, self.master, pieces, strict=True):
            m.grad = piece.view_as(p).to(m.dtype)
            if m is not p:  # the bf16 gradient stays, as torch keeps .grad
                p.grad.copy_(m.grad)
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                if m is not p:
                    p.copy_(m)  # rounded to bf16
                    m.grad = None  # the fp32 gradient lived for the step only
        return loss.item()

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by kind, counted from the tensors."""
        state = self.optimizer.state.values()
        moments = [t for s in state for k, t in s.items() if k != "step"]
        steps = [t for s in state for k, t in s.items() if k == "step"]
        kinds = {
            "weights": nbytes(self.params),
            "gradients": nbytes(p.grad for p in self.params if p.grad is not None),
            "master": nbytes(
                m for m, p in zip(self.master, self.params, strict=True) if m is not p
            ),
            "optimizer": nbytes(moments) + nbytes(steps),
        }
        return kinds


def nbytes(tensors: object) -> int:
    """Bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)  # type: ignore[attr-defined]


def held_formula(
    numel: int, tensors: int, param_dtype: torch.dtype, master: bool = True
) -> dict[str, int]:
    """What `MixedPrecision.held` must say after a step, for a model of `numel`
    parameters in `tensors` tensors: 2 + 2 + 4 + 8 bytes a parameter in bf16,
    4 + 4 + 0 + 8 in fp32 (2 + 2 + 0 + 4 in bf16 without a master), and AdamW's
    step counters."""
    w = torch.empty((), dtype=param_dtype).element_size()
    own = param_dtype == FP32 or not master
    return {
        "weights": w * numel,
        "gradients": w * numel,
        "master": 0 if own else 4 * numel,
        "optimizer": 2 * (w if own else 4) * numel + ADAMW_STEP * tensors,
    }


def reduction_error(values: Tensor, dtype: torch.dtype, group: Group = None) -> float:
    """Largest relative error of an all_reduce (sum) run in `dtype`, against the
    exact sum (float64) of the same inputs as `dtype` holds them: what the
    additions lost, not the cast. A collective: every rank of `group` calls it."""
    inputs = values.to(dtype)
    exact = inputs.to(torch.float64)
    dist.all_reduce(exact, group=group)
    summed = inputs.clone()
    dist.all_reduce(summed, group=group)
    return ((summed.to(torch.float64) - exact).abs() / exact.abs()).max().item()
