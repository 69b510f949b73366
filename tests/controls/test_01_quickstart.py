"""Negative controls of chapter 1: its own cells (torch's DDP on 4 ranks, each on
its own 32 samples; the digits trained and checkpointed), run with a fault planted
in the chapter's code, must turn each verdict they print from PASS to FAIL.

The faults: DDP's all-reduce skipped (every backward under no_sync), one weight of
rank 1's replica one ulp apart, a comm hook that sums the gradients instead of
averaging them (ddp_faults.summed_hook), a checkpoint saved from a fresh model
instead of the trained one. One spawn of the chapter's 4 ranks runs them all
(tests/controls/harness.py); the lines as written are the stored notebook's.
"""

from __future__ import annotations

import harness
from harness import Code, Fault, Swap

CHAPTER = harness.Chapter("01_quickstart", ranks=4, stored=True)
MODEL = "ddp = DDP(model, device_ids=accelerator.ddp_device_ids(device))"  # the cells
LOOP = "loss.backward()  # DDP averages the gradients across ranks here"
IDENTICAL = "parameters identical on all ranks"
ALONE = "alone = models.toy_mlp().to(device)"
VS_ONE = "mean loss of the ranks vs one process"
DIGITS = ["sampler = DistributedSampler(train_set", "ddp_net = DDP(net"]
CHECKPOINT = "checkpoint matches the trained model"
ONE_ULP = Code(
    "%%ranks\n"
    "if rank == 1:  # one weight of rank 1's replica, one ulp apart\n"
    "    w = model[0].weight.data\n"
    "    w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0, device=device))"
)
FAULTS = {
    "no sync": Fault(
        [MODEL, LOOP, IDENTICAL],
        Swap(  # forward and backward under no_sync: nothing is averaged
            "    loss = torch.nn.functional.mse_loss(ddp(x), y)",
            "    with ddp.no_sync():\n"
            "        loss = torch.nn.functional.mse_loss(ddp(x), y)\n"
            "        loss.backward()",
        ),
        Swap("    loss.backward()  # DDP averages the gradients across ranks here", ""),
    ),
    "one ulp": Fault([MODEL, LOOP, ONE_ULP, IDENTICAL]),
    "summed": Fault(
        [MODEL, LOOP, IDENTICAL, ALONE, VS_ONE],
        Swap(
            f"{MODEL}  # [index] on a GPU",
            f"{MODEL}\nfrom ddp_faults import summed_hook\n"
            "ddp.register_comm_hook(None, summed_hook)",
        ),
    ),
    "fresh model saved": Fault(
        [MODEL, IDENTICAL, *DIGITS, CHECKPOINT],
        Swap(
            "    torch.save(ddp_net.module.state_dict(), path)",
            "    torch.save(models.digits_mlp().state_dict(), path)",
        ),
    ),
}


CONTROLS = harness.Controls(
    "01_quickstart",
    test_replicas_that_never_average_are_not_identical=harness.Flip(
        ["no sync"],
        r"parameters identical on all ranks: True",
        "DDP's all-reduce skipped (every step under no_sync): each rank follows its "
        "own data",
    ),
    test_replicas_one_ulp_apart_are_not_identical=harness.Flip(
        ["one ulp"],
        r"parameters identical on all ranks: True",
        "one weight of rank 1's replica one ulp apart (torch.nextafter)",
    ),
    test_a_ddp_that_sums_gradients_is_not_one_process=harness.Flip(
        ["summed"],
        r"mean loss of the ranks vs one process: .*PASS",
        "DDP's gradients summed over the ranks, not averaged (a comm hook without the "
        "division)",
        r"parameters vs one process: .*PASS",
        "DDP's gradients summed over the ranks, not averaged (a comm hook without the "
        "division)",
    ),
    test_a_checkpoint_of_another_model_fails=harness.Flip(
        ["fresh model saved"],
        r"checkpoint matches the trained model",
        "the checkpoint saved from a fresh model, not the trained one",
    ),
)
globals().update(CONTROLS.tests())
