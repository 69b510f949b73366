"""distcourse.plan in one process: its counts equal the package's own (TinyGPT's
parameters, hybrid.cost's bytes, the schedules' micro-batches in flight), inputs
round-trip through plain dicts, impossible layouts are refused naming the
constraint (module and CLI: exit code 2, one line), and the search ranks what fits.
The comparison with bytes measured on ranks is tests/test_plan_measured.py."""

from __future__ import annotations

import itertools
import json

import pytest

from distcourse import plan
from distcourse.examples.gpt import GPTConfig, TinyGPT
from distcourse.parallel import hybrid
from distcourse.parallel.pipeline import in_flight, interleaved, one_f_one_b
from distcourse.plan import cli, memory, timing

CFG = GPTConfig(vocab=64, block_size=8, n_layer=8, n_head=8, n_embd=16)
MODEL = plan.ModelSpec.from_config(CFG)
FP32 = plan.DTypePolicy("fp32")
H100 = plan.named("h100")


def test_parameters_are_tinygpts() -> None:
    for cfg in (CFG, GPTConfig()):
        spec = plan.ModelSpec.from_config(cfg)
        assert spec.params == sum(p.numel() for p in TinyGPT(cfg).parameters())
        assert spec.config() == cfg


def test_stage_parameters_and_wire_bytes_are_hybrid_costs() -> None:
    for layout in hybrid.layouts(8):
        lay = plan.PlanLayout(layout.dp, layout.tp, layout.pp, layout.pp)
        for s in range(layout.pp):
            assert memory.stage_params(MODEL, lay, s) == hybrid.parameters_held(
                layout, CFG, s
            )
            sent = timing.rank_messages(MODEL, 16, FP32, lay, s)
            want = hybrid.bytes_per_step(layout, CFG, 16, s)
            assert {a: sent[a][0] for a in want} == want


def test_in_flight_is_the_schedules() -> None:
    for p, m in ((4, 4), (4, 8), (2, 6), (8, 8)):
        lay = plan.PlanLayout(pp=p, micro_batches=m)
        assert [memory.in_flight(lay, r) for r in range(p)] == in_flight(
            one_f_one_b(p, m)
        )
    for p, m, v in ((4, 4, 2), (4, 8, 2), (2, 4, 3), (4, 2, 2), (2, 6, 2)):
        lay = plan.PlanLayout(pp=p, micro_batches=m, schedule="interleaved", virtual=v)
        sched = interleaved(p, m, v)
        assert [memory.in_flight(lay, r) for r in range(p)] == in_flight(sched)
        ones = [1] * v  # every chunk one unit: the walk counts units in flight
        walk = [memory.in_flight_bytes(ones, lay, r) for r in range(p)]
        assert walk == in_flight(sched)


def test_gradient_accumulation_holds_one_micro_batch() -> None:
    def held(m: int) -> dict[str, int]:
        return plan.rank_memory(MODEL, 16, FP32, plan.PlanLayout(micro_batches=m), 0)

    ids = 8 * CFG.block_size + 4  # positions and the loss: whatever the batch
    assert (held(4)["activations"] - ids) * 4 == held(1)["activations"] - ids
    assert held(4)["parameters"] == held(1)["parameters"]


def test_interleaved_takes_the_micro_batches_the_schedule_takes() -> None:
    for p, m in itertools.product((2, 4), range(4, 13)):
        layout = plan.PlanLayout(
            pp=p, micro_batches=m, schedule="interleaved", virtual=2
        )
        try:
            interleaved(p, m, 2)
            runs = True
        except ValueError:
            runs = False
        try:
            plan.check(MODEL, m, layout)
            allowed = True
        except ValueError:
            allowed = False
        assert allowed == runs, (p, m)


def test_zero_formula_is_chapter_9s() -> None:
    from distcourse.parallel.zero import formula

    for stage in range(4):
        assert plan.model_state(FP32, stage, 1000, 250, 3) == formula(
            stage, 1000, 250, 3
        )
    mixed = plan.model_state(plan.DTypePolicy("bf16"), 0, 10, 10, 0)
    assert mixed == dict(parameters=20, gradients=20, optimizer=120)  # 2 + 2 + 12


def test_inputs_round_trip_through_plain_dicts() -> None:
    layout = plan.PlanLayout(2, 2, 2, 4, 1, True, "full", "1f1b", 1, True)
    found = plan.predict(MODEL, 16, FP32, layout, H100)
    data = json.loads(json.dumps(found.to_dict()))
    assert plan.Prediction.from_dict(data).to_dict() == data
    assert set(data["memory"]) == {*plan.KINDS, "total"}
    assert set(data["time"]) == {"compute", "bubble", "tp", "pp", "dp", "total"}
    assert plan.Hardware.from_dict(H100.to_dict()) == H100
    with pytest.raises(ValueError, match=r"unknown keys \['tpp'\]"):
        plan.PlanLayout.from_dict({"tpp": 2})


def test_from_params_gives_common_shapes() -> None:
    assert plan.ModelSpec.from_params(7e9) == plan.ModelSpec(32, 4096, 32, 4096, 32000)
    assert plan.ModelSpec.from_params(175e9).layers == 96  # GPT-3's 96 x 12288
    assert plan.ModelSpec.from_params(175e9).hidden == 12288


BAD = [
    (dict(dp=8, tp=3), 64, "= 24 GPUs, but there are 64"),
    (dict(tp=3), None, "heads=8 is not divisible by tp=3"),
    (dict(pp=16), None, "16 stages, more than layers=8"),
    (dict(pp=3, micro_batches=3), None, "layers=8 do not divide into 3 equal stages"),
    (dict(pp=2, micro_batches=1), None, "1f1b needs micro_batches >= pp: 1 < pp=2"),
    (dict(virtual=2, schedule="interleaved"), None, "needs a pipeline: pp=1"),
    (
        dict(pp=4, micro_batches=9, schedule="interleaved", virtual=2),
        None,
        "in m // pp = 2 equal rounds: micro_batches=9 does not split into 2",
    ),
    (dict(dp=3), None, "batch=16 does not split into dp=3"),
    (dict(sp=True), None, "sequence parallel (sp) needs tp > 1"),
    (dict(pp=2, micro_batches=2, virtual=2), None, "needs schedule=interleaved"),
    (dict(pp=2, micro_batches=2, schedule="interleaved"), None, "virtual >= 2"),
]


@pytest.mark.parametrize("options, gpus, message", BAD)
def test_impossible_layouts_are_refused_naming_the_constraint(
    options: dict, gpus: int | None, message: str
) -> None:
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        plan.predict(MODEL, 16, FP32, plan.PlanLayout(**options), H100, gpus)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(zero=4), "zero (the ZeRO stage) must be 0, 1, 2 or 3"),
        (dict(ckpt="some"), "ckpt must be one of none, selective, full"),
        (dict(tp=0), "tp must be an integer >= 1"),
    ],
)
def test_bad_values_are_refused(options: dict, message: str) -> None:
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        plan.PlanLayout(**options)


TINY = [
    "--layers",
    "8",
    "--hidden",
    "16",
    "--heads",
    "8",
    "--seq",
    "8",
    "--vocab",
    "64",
]


def test_cli_one_layout_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*TINY, "--batch", "16", "--dtype", "fp32", "--json"]
    assert cli.main([*args, "--layout", "dp=2,tp=2,pp=2,m=2"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    layout = plan.PlanLayout(2, 2, 2, 2)
    assert found == plan.predict(MODEL, 16, FP32, layout, H100).to_dict()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--layout", "dp=2,tp=3,pp=1"], "heads=8 is not divisible by tp=3"),
        (["--layout", "dp=2,tp=2,pp=4,m=2"], "1f1b needs micro_batches >= pp"),
        (["--layout", "dp=2,tpp=2"], "unknown keys ['tpp']"),
        (["--layout", "dp=x"], "dp must be an integer, got 'x'"),
        (["--gpus", "8", "--layout", "dp=2"], "dp=2 x tp=1 x pp=1 = 2 GPUs"),
        ([], "give --gpus"),
        (["--gpus", "8", "--dtype", "fp16"], "argument --dtype: invalid choice"),
        (["--gpus", "eight"], "argument --gpus: invalid int value"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_code_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*TINY, "--batch", "16", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_search_ranks_layouts_that_fit_fastest_first() -> None:
    policy = plan.DTypePolicy("bf16")
    found = plan.search(plan.ModelSpec.from_params(7e9), 64, policy, H100, 16)
    assert found and all(p.fits for p in found)
    times = [p.time["total"] for p in found]
    assert times == sorted(times)
    assert all(p.layout.tp <= 8 and p.layout.gpus == 16 for p in found)
    fixed = plan.search(
        plan.ModelSpec.from_params(7e9), 64, policy, H100, 16, dict(zero=3, tp=4)
    )
    assert fixed and all(p.layout.zero == 3 and p.layout.tp == 4 for p in fixed)
    out = cli.run(["--params", "7e9", "--gpus", "16", "--batch", "64", "--top", "3"])
    assert len(out.splitlines()) == 2 + 1 + 3  # model, hardware, header, 3 rows


def test_explain_prints_every_formula() -> None:
    text = cli.run(["--explain"])
    for needle in ("params = L (12 h^2 + 13 h)", "min(m, p - r)", "step = compute"):
        assert needle in text


def test_data_parallel_wire_bytes_are_chapter_9s_on_even_shares() -> None:
    from distcourse.parallel.zero import step_bytes

    d = 4  # a model of P elements, P % d == 0: every share even
    for zero in (0, 1, 2):
        model = plan.ModelSpec(1, 16, 1, 1, 1)
        P = memory.stage_params(model, plan.PlanLayout(), 0)
        layout = plan.PlanLayout(dp=d, zero=zero)
        sent = timing.rank_messages(model, d, FP32, layout, 0)["dp"][0]
        ours = [step_bytes(zero, [P // d] * d, P // d, r) for r in range(d)]
        assert P % d == 0 and ours == [sent] * d, (zero, P)


def test_zero_papers_figure_1() -> None:
    """Rajbhandari et al. 2020, figure 1: 7.5B parameters on 64 GPUs, mixed
    precision with Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB per GPU."""
    psi, d = 7_500_000_000, 64
    policy = plan.DTypePolicy("bf16")
    got = [
        sum(plan.model_state(policy, zero, psi, -(-psi // d), 0).values()) / 1e9
        for zero in range(4)
    ]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


def test_bf16_activations_are_the_planners() -> None:
    """A TinyGPT with bf16 weights under CPU autocast (chapter 10's mixed precision)
    keeps for backward what the planner says for the bf16 policy, within 5 %: bf16
    values, an fp32 softmax in the loss, int64 token ids."""
    import torch

    from distcourse.examples.gpt import lm_loss, token_batches
    from distcourse.parallel.tensor.memory import saved_activation_bytes

    cfg = GPTConfig(vocab=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = TinyGPT(cfg).to(torch.bfloat16)
    ((x, y),) = token_batches(1, 4, cfg)

    class Step(torch.nn.Module):  # the forward and its loss, as one module
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return lm_loss(self.model(ids), y)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = sum(saved_activation_bytes(Step(), x).values())
    spec = plan.ModelSpec.from_config(cfg)
    policy = plan.DTypePolicy("bf16")
    want = plan.rank_memory(spec, 4, policy, plan.PlanLayout(), 0)["activations"]
    assert abs(measured - want) <= 0.05 * measured, (measured, want)
