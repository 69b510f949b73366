"""Chapter 8's torchrun script: 8 ranks as 2 "nodes" x 4 processes on this machine's
loopback (two torchrun agents, c10d rendezvous) train the 2x2x2 layout, and its
--compare runs chapter 8's check (the first step's gradients, SGD's losses and
parameters against one process).

What listens: the ranks' stores and gloo stay on 127.0.0.1 (MASTER_ADDR is the
--local-addr, so runtime.init_from_env keeps gloo on loopback); the rendezvous store
of the first torchrun agent listens on every interface while the test runs, torch's
choice that no option changes (ARCHITECTURE.md, "What listens where")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _node(rank: int, port: int) -> subprocess.Popen:
    """One torchrun agent: a "node" of 4 ranks, rendezvous on loopback only."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--nproc-per-node",
            "4",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{LOOPBACK}:{port}",
            "--rdzv-id",
            "hybrid-test",
            "--local-addr",
            LOOPBACK,
            "book/scripts/hybrid_train.py",
            "--steps",
            "8",
            "--compare",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"},
    )


def test_two_nodes_of_four_train_to_one_process_losses() -> None:
    port = _free_port()
    nodes = [_node(0, port), _node(1, port)]
    try:
        outs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()  # no-op if it ended; never leave one behind
    for node, (_, err) in zip(nodes, outs, strict=True):
        assert node.returncode == 0, err[-3000:]
    # c10d numbers the nodes in order of arrival (--node-rank is ignored): rank 0
    # and its lines are on either; the other node's ranks print nothing
    first, second = sorted((out.splitlines() for out, _ in outs), key=len)[::-1]
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
