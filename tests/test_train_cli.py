"""The script's flags become a layout and a run, and `--check` accepts or refuses a
layout by name with no rank started (the script's torchrun runs are in
test_scripts_train_gpt.py)."""

from __future__ import annotations

import pytest
import torch

from distcourse.train.cli import main
from distcourse.train.flags import parser, settings
from distcourse.train.layout import TrainLayout


def test_flags_become_the_layout_and_the_run() -> None:
    args = parser().parse_args(
        ["--dp", "2", "--pp", "2", "--tp", "2", "--m", "4", "--ckpt", "full"]
        + ["--optimizer", "sgd", "--lr", "0.5", "--steps", "7", "--layers", "2"]
        + ["--ckpt-dir", "out", "--ckpt-every", "3", "--seed", "5"]
    )
    layout, run = settings(args)
    assert layout == TrainLayout(dp=2, pp=2, tp=2, micro_batches=4, ckpt="full")
    assert (run.optimizer, run.lr, run.steps, run.n_layer) == ("sgd", 0.5, 7, 2)
    assert (run.ckpt_dir, run.ckpt_every, run.seed) == ("out", 3, 5)
    more = ["--model", "gpt2-124m", "--dtype", "bf16", "--zero", "2", "--clip", "1"]
    layout, run = settings(parser().parse_args(more + ["--schedule", "interleaved"]))
    assert (layout.dtype, layout.data_mode, layout.schedule) == (
        "bfloat16",
        "zero2",
        "interleaved",
    )
    assert (run.preset, run.lr, run.clip, run.seq) == ("gpt2-124m", 6e-4, 1.0, None)


def test_micro_batches_has_a_long_name_torchrun_accepts() -> None:
    layout, _ = settings(parser().parse_args(["--pp", "2", "--micro-batches", "2"]))
    assert layout.micro_batches == 2
    layout, run = settings(parser().parse_args(["--fsdp", "--dp", "4"]))
    assert layout.fsdp and run.optimizer == "adamw" and run.ckpt_dir is None


def test_data_parallelism_takes_the_ranks_the_other_degrees_leave(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # no torchrun: one rank
    assert settings(parser().parse_args([]))[0].dp == 1
    monkeypatch.setenv("WORLD_SIZE", "8")  # as torchrun sets it
    for flags, dp in ([], 8), (["--pp", "2"], 4), (["--pp", "2", "--tp", "2"], 2):
        assert settings(parser().parse_args(flags))[0].dp == dp, flags
    assert settings(parser().parse_args(["--dp", "2", "--pp", "2"]))[0].dp == 2
    # 8 sequences a data-parallel rank unless --batch says otherwise
    assert settings(parser().parse_args([]))[1].batch == 64
    assert settings(parser().parse_args(["--pp", "2"]))[1].batch == 32
    assert settings(parser().parse_args(["--batch", "4"]))[1].batch == 4
    main(["--check"])
    assert capsys.readouterr().out == "8x1x1 (dp x pp x tp) fits 8 ranks: accepted\n"
    monkeypatch.setenv("WORLD_SIZE", "6")  # pp 4 does not divide 6 ranks
    with pytest.raises(SystemExit) as ended:
        main(["--check", "--pp", "4", "--micro-batches", "4"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "layout dp=1 x pp=4 x tp=1 = 4 ranks, but the world has 6" in err


def test_check_refuses_by_name_and_accepts_every_composition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--check", "--dp", "2", "--cp", "2"])
    assert ended.value.code == 2
    assert "--cp 2: this trainer does not compose context" in capsys.readouterr().err
    main(["--check", "--dp", "2", "--pp", "2", "--micro-batches", "2", "--fsdp"])
    assert capsys.readouterr().out == (
        "2x2x1 m2 1f1b fsdp (dp x pp x tp) fits 4 ranks: accepted\n"
    )


def test_without_torchrun_a_layout_of_more_ranks_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as ended:
        main(["--tp", "2", "--steps", "1"])  # one process: a world of 1
    assert ended.value.code == 2
    assert "= 2 ranks, but the world has 1" in capsys.readouterr().err


def test_plan_chooses_the_layout_and_refuses_layout_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")  # as torchrun sets it
    monkeypatch.delenv("RANK", raising=False)
    main(["--check", "--plan", "h100"])
    first, accepted = capsys.readouterr().out.splitlines()
    name = "4x2x1 m2 1f1b zero1"
    assert first.startswith(f"--plan h100: {name} (dp x pp x tp) on 8 ranks")
    assert first.endswith("ms per step on h100 (the planner's model)")
    assert accepted == f"{name} (dp x pp x tp) fits 8 ranks: accepted"
    with pytest.raises(SystemExit) as ended:
        main(["--check", "--plan", "h100", "--dp", "2"])
    assert ended.value.code == 2
    assert "--plan h100 with --dp: --plan chooses the layout" in capsys.readouterr().err


def test_a_memory_snapshot_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the snapshot is taken")
    with pytest.raises(SystemExit) as ended:
        main(["--memory-snapshot", "snap.pickle", "--steps", "1"])
    assert ended.value.code == 2
    assert "--memory-snapshot records CUDA's allocator" in capsys.readouterr().err
