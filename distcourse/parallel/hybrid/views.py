"""What a HybridGPT rank holds, seen from outside its step: `Views`, its base.

- `one_process_state` / `one_process_grads`: this rank's stage (DDP, one stage a
  rank) as whole tensors under TinyGPT's names, its TP group gathering the slices
  (chapter 8's check);
- `local(kind)`: each tensor the rank holds with its `placement.Box`, gathering
  nothing (checkpoints, `--compare`);
- `held()`: bytes by kind, counted from the tensors;
- `evaluate(x, y)`: the share's mean loss, forward only, through the stages in
  order (a receive from the previous stage's rank, a send to the next's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse.parallel import fsdp
from distcourse.parallel.hybrid import data
from distcourse.parallel.hybrid.stages import one_process_state
from distcourse.parallel.pipeline.shapes import stage_shapes


def nbytes(tensors: Any) -> int:
    """Bytes of the tensors among `tensors` (None skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


class Views:
    """HybridGPT's views of its own state (HybridGPT inherits them; the
    attributes they read are HybridGPT's)."""

    def one_process_state(self) -> dict[str, Tensor]:
        """The full parameters of this rank's stage under TinyGPT's names (its TP
        group gathers the slices: every rank calls it). DDP's, one stage a rank."""
        return one_process_state(self.plain[0], self.first_layer, self.cfg.n_layer)

    def one_process_grads(self) -> dict[str, Tensor]:
        """The gradients of this rank's stage as `one_process_state` gives the
        parameters: whole tensors under TinyGPT's names (a collective over the tp
        group). Read after a `step`, they are that step's averaged gradients."""
        params = list(self.module.parameters())
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
        try:
            return {k: v.clone() for k, v in self.one_process_state().items()}
        finally:
            with torch.no_grad():
                for p, value in zip(params, saved, strict=True):
                    p.copy_(value)

    def local(self, kind: str) -> data.Local:
        """This rank's tensors of `kind` with their Box in the one-process model:
        "param" (what the module holds), "grad" (the gradients the optimizer
        steps, after `reduce`), or an optimizer state ("exp_avg", "exp_avg_sq")."""
        if self.runs is not None and kind != "param":  # ZeRO: pieces, mixed params
            tensors = [self.tensor_of(p, kind) for p in self.stepped]
            return [
                (box, t[where].view(box.sizes))
                for t, found in zip(tensors, self.runs, strict=True)
                if t is not None
                for box, where, _ in found
            ]
        boxes: list = self.boxes
        if self.data_mode == "fsdp":
            boxes = data.piece_boxes(self.module, self.boxes)
        out = []
        for p, box in zip(self.module.parameters(), boxes, strict=True):
            t = self.tensor_of(p, kind)
            if box is not None and t is not None:
                out.append((box, t))
        return out

    def tensor_of(self, p: Tensor, kind: str) -> Tensor | None:
        """Parameter `p` itself, its gradient, or its optimizer state `kind`."""
        if kind == "param":
            return p
        if kind == "grad":
            return p.grad
        return self.optimizer.state.get(p, {}).get(kind)

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, counted from its tensors: parameters (FSDP's
        pieces; ZeRO's flat buffer), the gradients alive (ZeRO-1's flat gradient
        and the pieces' too), the optimizer's moments (AdamW's step counters, 4
        bytes a tensor, left out), and the activations kept for backward at the
        last step's peak (0 where not metered)."""
        if self.flat is not None:
            params = [self.flat.flat]
            grads = [*self.flat.gradient_buffers(), *(p.grad for p in self.stepped)]
        else:
            params = list(self.module.parameters())
            grads = [p.grad for p in params]
        state = [
            v
            for s in self.optimizer.state.values()
            for k, v in s.items()
            if k != "step"
        ]
        return dict(
            params=nbytes(params),
            grads=nbytes(grads),
            optimizer=nbytes(state),
            activations=self.meter.peak if self.meter is not None else 0,
        )

    def tensors(self) -> list[Tensor]:
        """Every tensor this rank's model state holds now: parameters (FSDP's
        pieces and its units' gathered buffers), gradients, optimizer state,
        ZeRO's flat buffers and DDP's buckets (what a memory count watches from
        the start of a step, `allocations.PeakMemory(held=...)`)."""
        params = [*self.module.parameters(), *self.stepped]
        out = [*params, *(p.grad for p in params if p.grad is not None)]
        out += [v for s in self.optimizer.state.values() for v in s.values()]
        if self.flat is not None:
            out += [self.flat.flat, *self.flat.gradient_buffers()]
        out += [b.buffer for b in self.buckets]
        out += [u.buffer for u in fsdp.units(self.module)]
        return [t for t in out if torch.is_tensor(t)]

    def evaluate(self, x: Tensor, y: Tensor) -> float:
        """The mean loss of the whole batch (x, y: this rank's share, on the
        device) under no_grad, on every rank: each stage in order, its input
        received from the previous stage's rank, its output sent to the next's."""
        self.agree_on(x)
        pp, me = self.layout.pp, self.stage
        ranks, n = self.mesh.ranks("pp"), len(self.twins)
        shapes = stage_shapes(self.twins, x.shape, x.dtype)
        h, loss = x, None
        with torch.no_grad():
            for s in range(n):
                if s % pp != me:
                    continue
                before = (s - 1) % pp
                if s > 0 and before != me:
                    shape, dtype = shapes[s]
                    h = torch.empty(shape, dtype=dtype, device=x.device)
                    dist.recv(h, src=ranks[before])
                h = self.running[s](h)
                after = (s + 1) % pp
                if s < n - 1 and after != me:
                    dist.send(h.contiguous(), dst=ranks[after])
            if n - 1 in self.running:
                loss = self.loss_fn(h, y) * self.accum
        self.agreed.add((tuple(x.shape), x.dtype))
        return self.mean_loss(loss)
