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
    assert set(data["memory"]) == set(data["peak"]) == {*plan.KINDS, "total"}
    parts = {"compute", "memory", "optimizer", "bubble"}
    assert set(data["time"]) == parts | {"tp", "pp", "dp", "total"}
    assert set(data["messages"]) == {"tp", "pp", "dp"}
    assert data["moment"] in data["moments"] and set(data["moments"]) <= {
        "loss",
        "backward",
        "step",
    }
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
    """DP's all-reduce and ZeRO-2 as chapter 9 counts them; ZeRO-1 as FlatZero
    runs it (reduce-scatter + all-gather, `FlatLayout.step_bytes`), not as torch's
    ZeroRedundancyOptimizer (all-reduce + broadcasts, `step_bytes(1, ...)`)."""
    import torch

    from distcourse.parallel.zero import FlatLayout, step_bytes

    d = 4  # a model of P elements, P % d == 0: every share even
    model = plan.ModelSpec(1, 16, 1, 1, 1)
    P = memory.stage_params(model, plan.PlanLayout(), 0)
    assert P % d == 0
    sent = {}
    for zero in (0, 1, 2):
        layout = plan.PlanLayout(dp=d, zero=zero)
        sent[zero] = timing.rank_messages(model, d, FP32, layout, 0)["dp"][0]
    for zero in (0, 2):
        ours = [step_bytes(zero, [P // d] * d, P // d, r) for r in range(d)]
        assert ours == [sent[zero]] * d, (zero, P)
    assert sent[1] == FlatLayout([torch.zeros(P)], d, 2**20).step_bytes()
    assert sent[1] < step_bytes(1, [P // d] * d, P // d, 0)  # torch's 3 Psi


def test_zero_1_moves_what_dp_and_zero_2_move() -> None:
    """ZeRO-1 is 2 Psi (ZeRO paper 7.2.1): DP's all-reduce bytes at d ranks when
    the shares are even, ZeRO-2's at one micro-batch always, 2 (d - 1) steps."""
    d, model = 8, plan.ModelSpec(1, 16, 1, 1, 1)
    P = memory.stage_params(model, plan.PlanLayout(), 0)
    sent = {
        z: timing.rank_messages(model, d, FP32, plan.PlanLayout(dp=d, zero=z), 0)
        for z in (0, 1, 2)
    }
    assert P % d == 0 and sent[1]["dp"] == sent[0]["dp"] == sent[2]["dp"]
    assert sent[1]["dp"] == (2 * (d - 1) * 4 * P // d, 2 * (d - 1))
    odd = plan.ModelSpec(1, 15, 1, 1, 1)  # P % d != 0: padded shares
    one, two = (
        timing.rank_messages(odd, d, FP32, plan.PlanLayout(dp=d, zero=z), 0)["dp"]
        for z in (1, 2)
    )
    assert one == two


def test_sharded_gradients_pay_every_micro_batch() -> None:
    """The issue's example: 7B, 8 GPUs, batch 64, dp 8, ZeRO-2. With m = 8 the
    gradients are reduce-scattered 8 times (a share cannot hold a sum of full
    gradients), the weights all-gathered once; ZeRO-3 pays all three, m times."""
    model, bf16 = plan.ModelSpec.from_params(7e9), plan.DTypePolicy("bf16", "bf16")

    def dp(**fields: object) -> tuple[int, int]:
        layout = plan.PlanLayout(dp=8, **fields)
        return timing.rank_messages(model, 64, bf16, layout, 0)["dp"]

    q = -(-model.params // 8)
    rs = ag = 7 * 2 * q  # bf16 weights and reductions
    assert dp(zero=2, micro_batches=1) == (rs + ag, 2 * 7)
    assert dp(zero=2, micro_batches=8) == (8 * rs + ag, 9 * 7)
    assert dp(zero=1, micro_batches=8) == dp(zero=1) == (rs + ag, 2 * 7)
    assert dp(zero=0, micro_batches=8) == dp(zero=0)
    assert dp(zero=3, micro_batches=8) == (8 * (2 * ag + rs), 8 * 3 * 7)
    kept = dp(zero=3, micro_batches=8, reshard=False)
    assert kept == (8 * (ag + rs), 8 * 2 * 7)
    found = plan.predict(model, 64, bf16, plan.PlanLayout(8, zero=2), H100)
    more = plan.predict(
        model, 64, bf16, plan.PlanLayout(8, micro_batches=8, zero=2), H100
    )
    assert more.messages["dp"] > 4 * found.messages["dp"]
    out = cli.run("--params 7e9 --gpus 8 --batch 64 --layout dp=8,zero=2,m=8".split())
    assert "81,559 MiB = 79.6 GiB" in out  # what nvidia-smi reports, in GiB


def test_bf16_accumulation_holds_20_bytes_a_parameter() -> None:
    """The Ultra-Scale Playbook's 20 bytes: bf16 weights and gradients (2 + 2), an
    fp32 master and Adam's moments (12), an fp32 accumulation buffer (4) once
    m > 1; DDP's buckets (the reduce dtype, y) on top without bucket_view; a
    ZeRO-2/3 rank accumulates only its share."""
    model, bf16 = plan.ModelSpec.from_params(1e9), plan.DTypePolicy("bf16", "fp32")
    P, d = model.params, 8

    def held(**fields: object) -> dict[str, int]:
        layout = plan.PlanLayout(**fields)
        return plan.rank_memory(model, 64, bf16, layout, 0)

    for m in (1, 4):
        got = held(dp=d, micro_batches=m)
        steps = 4 * (16 * model.layers + 5)  # AdamW's step counters
        state = got["parameters"] + got["gradients"] + got["optimizer"] - steps
        accumulation = 4 * P if m > 1 else 0
        assert state == 16 * P and got["buffers"] == 4 * P + accumulation
        assert (state + accumulation) / P == (20 if m > 1 else 16)
        viewed = held(dp=d, micro_batches=m, bucket_view=True)
        assert viewed["buffers"] == accumulation
    share = 4 * -(-P // d)
    assert held(dp=d, micro_batches=4, zero=2)["buffers"] == share
    fp32 = plan.rank_memory(model, 64, FP32, plan.PlanLayout(micro_batches=4), 0)
    assert fp32["buffers"] == 0  # fp32 gradients accumulate in place


def test_zero_3_kept_holds_every_parameter_and_refuses_other_stages() -> None:
    layout = plan.PlanLayout(dp=4, zero=3, reshard=False)
    got = plan.rank_memory(MODEL, 16, FP32, layout, 0)
    assert got["buffers"] == 4 * MODEL.params
    assert layout.to_dict()["reshard"] is False
    assert "reshard" not in plan.PlanLayout(dp=4, zero=3).to_dict()
    assert plan.PlanLayout.from_dict(layout.to_dict()) == layout
    with pytest.raises(ValueError, match="reshard=False .* needs zero=3, got zero=2"):
        plan.check(MODEL, 16, plan.PlanLayout(dp=4, zero=2, reshard=False))
    assert cli.parse_layout("dp=4,zero=3,reshard=0") == layout


def test_the_search_chooses_bucket_views_and_resharding() -> None:
    model = plan.ModelSpec.from_params(7e9)
    found = plan.candidates(model, 64, 8, H100)
    for zero in (0, 1):
        views = {lay.bucket_view for lay in found if lay.zero == zero}
        assert views == {True, False}
    assert {lay.reshard for lay in found if lay.zero == 3} == {True, False}
    assert all(lay.reshard for lay in found if lay.zero < 3)
    best = plan.search(model, 64, plan.DTypePolicy("bf16"), H100, 8, dict(zero=0))
    assert best[0].layout.bucket_view  # the same time, fewer bytes


def test_zero_1_with_a_pipeline_can_win() -> None:
    """ZeRO-1 with pipelining (Megatron's usual choice): 2 Psi once a step while
    ZeRO-2/3 pay per micro-batch, so a search can now pick it."""
    model = plan.ModelSpec.from_params(70e9)
    found = plan.search(model, 512, plan.DTypePolicy("bf16", "fp32"), H100, 64)
    assert found[0].layout.zero == 1 and found[0].layout.pp > 1, found[0].layout


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
    keeps for backward exactly what the planner says for the bf16 policy on a CPU:
    bf16 values and norm statistics, an fp32 log-softmax in the loss, the
    attention kernel's fp32 log-sum-exp, int64 token ids."""
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

    with torch.autocast("cpu", dtype=torch.bfloat16):  # x a tensor of its own
        measured = sum(saved_activation_bytes(Step(), x.contiguous()).values())
    spec = plan.ModelSpec.from_config(cfg)
    policy, cpu = plan.DTypePolicy("bf16"), plan.local(0.0, 0.0, 1e9, 2**30, 1)
    want = plan.rank_memory(spec, 4, policy, plan.PlanLayout(), 0, cpu)
    assert measured == want["activations"]


def test_a_machine_of_gpu_ranks_plans_the_gpus_attention_kernels() -> None:
    """CPU ranks keep the math kernel's bytes; ranks on a GPU (the emulated one
    stands for an H100/H200) keep the fused kernel's, random-number state included:
    chapter 10's measured run on the emulated box missed the plan by 16 bytes a
    layer while its machine was planned as a CPU."""
    assert plan.arch_of("cpu") == "cpu"
    assert plan.arch_of("gpu:0") == "sm90"
    cpu = plan.local(1e-5, 1e-9, 1e9, 2**30, 4)
    gpu = plan.local(1e-5, 1e-9, 1e9, 2**30, 4, arch=plan.arch_of("gpu:0"))
    assert (cpu.arch, gpu.arch) == ("cpu", "sm90")
    spec = plan.ModelSpec(layers=2, hidden=64, heads=4, seq=32, vocab=256)
    fp32 = plan.DTypePolicy("fp32", "fp32", "adamw")
    on_cpu = plan.predict(spec, 4, fp32, plan.PlanLayout(), cpu)
    on_gpu = plan.predict(spec, 4, fp32, plan.PlanLayout(), gpu)
    assert on_cpu.memory["activations"] != on_gpu.memory["activations"]
