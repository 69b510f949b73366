"""Chapter 8's torchrun script: 8 ranks as 2 "nodes" x 4 processes on this machine's
loopback (two torchrun agents, c10d rendezvous) train the 2x2x2 layout, and its
--compare runs chapter 8's check (the first step's gradients, SGD's losses and
parameters against one process).

What listens: the ranks' stores and gloo stay on 127.0.0.1 (MASTER_ADDR is the
--local-addr, so runtime.init_from_env keeps gloo on loopback); the rendezvous store
of the first torchrun agent listens on every interface while the test runs, torch's
choice that no option changes (ARCHITECTURE.md, "What listens where")."""

from __future__ import annotations

import torch
from helpers import two_nodes

from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm


def test_two_nodes_of_four_train_to_one_process_losses() -> None:
    nodes = two_nodes(
        ["book/scripts/hybrid_train.py", "--steps", "8", "--compare"], "hybrid-test"
    )
    for status, _, err in nodes:
        assert status == 0, err[-3000:]
    # c10d numbers the nodes in order of arrival (--node-rank is ignored): rank 0
    # and its lines are on either; the other node's ranks print nothing
    first, second = sorted((out.splitlines() for _, out, _ in nodes), key=len)[::-1]
    assert second == []
    torch.manual_seed(0)  # what the script computes, here in one process
    alone = train_lm(TinyGPT(GPTConfig()), token_batches(8, 8, GPTConfig()))
    assert first == [
        f"2x2x2 (dp x pp x tp) on 8 ranks; rank 0 at dp=0, pp=0, tp=0; 8 steps, "
        f"losses {alone[0]:.4f} -> {alone[-1]:.4f}",
        "gradients of step 1 vs one process <= 1e-05: PASS",
        "losses of 8 sgd steps vs one process <= 1e-05: PASS",
        "parameters after 8 sgd steps vs one process <= 1e-05: PASS",
        "every parameter on some rank: True",
    ]
