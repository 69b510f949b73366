"""The method's tools, live on gloo ranks (distcourse/labs/tools.py, stacks.py):
DETAIL names a mismatch of shape or op and misses a same-shape swap; a monitored
barrier names every missing rank; DDP names unused parameters by index, and by name
at INFO; torch's Flight Recorder on gloo shows where the ranks part; faulthandler
shows each rank's stack in a hang. Each run spawns 2 to 4 ranks for a second or two.
"""

from __future__ import annotations

import pytest

from distcourse.labs import stacks, tools

TORCH_MESSAGE = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[4], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
    "device=cpu, memory_format=(nullopt))), but Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[2], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
    "device=cpu, memory_format=(nullopt))).Collectives differ in the following "
    "aspects: \t Tensor Tensor shapes: 4vs 2"
)


def test_detail_lines_cut_the_device_options_and_split_the_clauses() -> None:
    assert tools.detail_lines(TORCH_MESSAGE) == [
        "Detected mismatch between collectives on ranks.",
        "  Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=1, "
        "OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float),",
        "  but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=1, "
        "OpType=ALLREDUCE, TensorShape=[2], TensorDtypes=Float).",
        "Collectives differ in the following aspects: Tensor Tensor shapes: 4vs 2",
    ]


@pytest.mark.parametrize(
    ("case", "differ"),
    [("shape", "Tensor shapes: 4vs 2"), ("op", "Op type: ALLREDUCEvs BROADCAST")],
)
def test_detail_names_a_mismatch_of_shape_or_op(case: str, differ: str) -> None:
    text = "\n".join(tools.detail(case))
    assert text.startswith("rank 0 raised:"), text
    assert differ in text and "TensorDeviceTypes" not in text, text


def test_detail_lets_a_same_shape_swap_through() -> None:
    lines = tools.detail("swap")
    assert lines[0].startswith("DETAIL raised nothing"), lines
    assert lines[1:3] == ["  rank 0: a = 21, b = 12", "  rank 1: a = 12, b = 21"]


def test_detail_refuses_an_unknown_case_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match="case must be one of"):
        tools.detail("order")


def test_a_monitored_barrier_names_every_missing_rank() -> None:
    lines = tools.monitored_barrier(world=4, missing=(1, 3), wait=0.5)
    assert lines[0] == "rank 0: Ranks 1, 3 failed to pass monitoredBarrier in 500 ms"
    assert "ranks 1 and 3: never called it" in lines


def test_ddp_names_unused_parameters_by_index_then_by_name_at_info() -> None:
    lines = tools.ddp_unused()
    off, info = (
        lines.index("TORCH_DISTRIBUTED_DEBUG=OFF:"),
        lines.index("TORCH_DISTRIBUTED_DEBUG=INFO:"),
    )
    assert "for rank 0: 4 5" in lines[off + 1], lines
    assert not any("aux." in line for line in lines[off:info]), lines
    assert "for rank 0: aux.bias, aux.weight" in lines[info + 1], lines


def test_the_flight_recorder_on_gloo_shows_where_the_ranks_part() -> None:
    # the group's timeout also bounds gloo's connecting at start: 0.5 s failed in a
    # loaded CI run (DistStoreError at init), 2 s leaves room
    rank0, rank1 = stacks.flight_recorder(wait=2.0)
    assert rank0[0] == "last enqueued #3, last completed #2", rank0
    assert rank1[0] == "last enqueued #2, last completed #2", rank1
    assert rank0[-1].startswith("  #3 gloo:all_reduce Float[] from log_loss_on_rank_0")
    assert rank0[-1].endswith("never completed"), rank0


def test_an_empty_flight_recorder_says_so() -> None:
    dump = {
        "pg_status": {
            "0": {"last_enqueued_collective": -1, "last_completed_collective": -1}
        },
        "entries": [],
    }
    assert stacks.fr_lines(dump) == [
        "last enqueued #-1, last completed #-1",
        "  (no entries: this torch's gloo recorded nothing)",
    ]


def test_faulthandler_shows_each_ranks_stack_in_a_hang() -> None:
    rank0, rank1 = stacks.stacks(after=0.3, wait=0.6)
    assert rank0[0].split() == ["all_reduce", "torch/distributed/distributed_c10d.py"]
    assert rank1[0].split()[0] == "load_batch", rank1
    assert rank0[-1].split()[0] == rank1[-1].split()[0] == "train_step"


def test_stack_lines_without_the_step_say_so() -> None:
    assert stacks.stack_lines("Thread 0x1 (most recent call first):\n") == [
        "  (no stack of the step was written)"
    ]


def _entry(seq: int, retired: bool) -> dict:
    """A Flight Recorder entry of an all_reduce of 5 floats called from `step`."""
    frames = [{"filename": "/x/torch/distributed/c10d.py", "name": "all_reduce"}]
    frames.append({"filename": "/x/train.py", "name": "step"})
    return dict(
        collective_seq_id=seq,
        profiling_name="gloo:all_reduce",
        input_sizes=[[5]],
        input_dtypes=["Float"],
        retired=retired,
        frames=frames,
    )


def test_the_recorders_header_follows_its_entries_where_the_counter_lags() -> None:
    lagging = {"last_enqueued_collective": 2, "last_completed_collective": 1}
    dump = {"pg_status": {"0": lagging}, "entries": [_entry(1, True), _entry(2, True)]}
    dump["entries"].append(_entry(3, False))
    lines = stacks.fr_lines(dump)
    assert lines[0] == "last enqueued #3, last completed #2", lines
    assert lines[3] == "  #3 gloo:all_reduce Float[5] from step: never completed"
    dump["entries"] = []  # a torch whose gloo records nothing: the counters
    assert stacks.fr_lines(dump)[0] == "last enqueued #2, last completed #1"
