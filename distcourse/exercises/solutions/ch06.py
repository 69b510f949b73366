"""Solutions to chapter 6's exercises (`distcourse.exercises.ch06`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

pieces = [(5, 1), (5, 1), (5, 1), (5, 0)]  # 3 columns: 1, 1, 1, 0
boxing_bytes = 2 * (3 - 1) * 4  # my piece (2 rows x 3 columns) less column 0

matmul_sbp = {
    "S(0) x B": "S(0)",
    "B x S(1)": "S(1)",
    "S(1) x S(0)": "P",
    "P x B": "P",
    "B x B": "B",
}


def gather_pieces(piece: torch.Tensor) -> torch.Tensor:
    """Pad to the longest piece, all_gather, cut the padding off, concatenate."""
    world = dist.get_world_size()
    rows = torch.tensor([piece.shape[0]], device=piece.device)
    sizes = [torch.zeros_like(rows) for _ in range(world)]
    dist.all_gather(sizes, rows)
    longest = max(int(s) for s in sizes)
    padded = piece.new_zeros(longest, *piece.shape[1:])
    padded[: piece.shape[0]] = piece
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(n)] for p, n in zip(parts, sizes, strict=True)])
