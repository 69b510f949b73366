"""The planner page of the built book against `distcourse.plan`, in a real browser.

book/10b_planner_page.md runs a JavaScript port of the package's formulas
(_static/plan/*.js). This test is what keeps the two equal: in one page load it
types each input set of a deterministic grid (CASES: every degree, schedule,
ZeRO stage, checkpointing, sequence parallelism, dtype policy (fp32, bf16,
amp-bf16), optimizer, GPU and model preset, chapter 12's experts (MoE, ep) and
context parallelism (cp), and impossible layouts) into the page's form as a reader
would (a value, then an input event, field by field), reads every number the page
shows (each carries its exact value in data-key / data-value), and compares them
with `plan.predict(...).to_dict()`: byte, FLOP and GPU counts exactly, the peak's
moment by name, seconds, tokens/s and MFU to a relative 1e-9; for an impossible
layout, the page's message must be the ValueError's. Served and driven as
tests/test_book_browser.py does (its fixtures); `make browser` builds the book
first.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
from test_book_browser import (  # noqa: F401 (fixtures)
    BLOCKS,
    HEIGHT,
    LOAD_MS,
    SIDEWAYS,
    WIDTH,
    browser,
    site,
)

from distcourse import plan

PAGE = "book/10b_planner_page.html"
GB, MIB = 10**9, 2**20
# The form's fields in the order they are typed: the GPU first (choosing one fills
# the SHEET fields after it with its datasheet figures), then the rest.
SHEET = (
    "tflops_fp32 tflops_bf16 efficiency_fp32 efficiency_bf16 bandwidth_tbs "
    "efficiency_memory memory_mib workspace_mib context_mib nccl_mib node_gbs "
    "network_gbs alpha_node_us alpha_network_us gpus_per_node"
).split()
ORDER = ["gpu", *SHEET] + (
    "layers hidden heads seq vocab experts top_k capacity_factor batch gpus dtype "
    "reduce optimizer dp tp pp micro_batches ep cp schedule virtual zero ckpt sp "
    "bucket_view reshard"
).split()
DENSE = dict(experts=0, top_k=1, capacity_factor=1.25, ep=1, cp=1)
# A GPU in the form's units (TFLOP/s, TB/s, MiB, GB/s a direction, microseconds):
# the figures plan/hardware.py takes from the datasheets (NVLink's halved), the
# memory nvidia-smi reports, cuBLAS's workspaces, 5 and 10 us, 8 GPUs a node. Typed
# unchanged, they give plan.GPUS[gpu] to the bit (test_the_grid_covers_every_setting).
SHEETS = {
    gpu: dict(
        zip(
            SHEET,
            (*flops, 0.8, 0.65, tbs, 0.8, mib, ws, 512, 512, *links, 5, 10, 8),
            strict=True,
        )
    )
    for gpu, (flops, tbs, mib, ws, links) in {
        "h100": ((67, 989.5), 3.35, 81559, 64, (450, 50)),
        "h200": ((67, 989.5), 4.8, 143771, 64, (450, 50)),
        "a100": ((19.5, 312), 2.039, 81920, 16.25, (300, 25)),
    }.items()
}
CHANGED = dict(  # a GPU of the reader's own figures
    tflops_fp32=30.5, tflops_bf16=400, memory_mib=40960, node_gbs=200
) | dict(network_gbs=12.5, alpha_node_us=2.5, alpha_network_us=20, bandwidth_tbs=1.5)
CHANGED |= dict(efficiency_fp32=0.7, efficiency_memory=0.9, workspace_mib=32)
CHANGED |= dict(context_mib=600, nccl_mib=300)
SHAPE = ("layers", "hidden", "heads", "seq", "vocab")
MODELS = {  # a small GPT, and the shapes of ModelSpec.from_params(7e9), (70e9)
    "small": (8, 512, 8, 1024, 50304),
    "7b": (32, 4096, 32, 4096, 32000),
    "70b": (68, 9216, 72, 4096, 32000),
}
PRESETS = {"1b": 1e9, "7b": 7e9, "13b": 13e9, "70b": 70e9, "175b": 175e9}
# dp, tp, pp, micro-batches, schedule, stages per rank, model
LAYOUTS = (
    (1, 1, 1, 1, "1f1b", 1, "small"),
    (8, 1, 1, 1, "1f1b", 1, "7b"),
    (2, 4, 1, 1, "1f1b", 1, "small"),
    (1, 8, 1, 1, "1f1b", 1, "70b"),
    (4, 2, 2, 4, "1f1b", 1, "7b"),
    (2, 2, 4, 4, "gpipe", 1, "small"),
    (1, 1, 8, 8, "1f1b", 1, "small"),
    (2, 1, 4, 8, "interleaved", 2, "7b"),
    (1, 2, 2, 4, "interleaved", 2, "small"),
    (16, 2, 2, 8, "1f1b", 1, "7b"),
    (8, 8, 1, 1, "1f1b", 1, "70b"),
    (4, 8, 4, 16, "1f1b", 1, "70b"),
    (64, 1, 1, 1, "1f1b", 1, "small"),
    (1, 1, 2, 2, "gpipe", 1, "7b"),
    (3, 1, 2, 3, "gpipe", 1, "small"),
    (2, 8, 8, 16, "interleaved", 4, "7b"),
    (4, 1, 1, 4, "1f1b", 1, "small"),  # gradient accumulation
    (1, 1, 2, 6, "interleaved", 2, "small"),  # 3 rounds of 2
)
# chapter 12's axes: a layout as above, then experts, top_k, capacity factor, ep, cp
AXES = (
    (2, 1, 1, 1, "1f1b", 1, "small", 8, 2, 1.25, 2, 1),
    (1, 2, 1, 1, "1f1b", 1, "small", 8, 1, 1.0, 4, 1),
    (2, 2, 2, 4, "1f1b", 1, "small", 16, 2, 1.25, 2, 2),
    (1, 1, 1, 1, "1f1b", 1, "small", 0, 1, 1.25, 1, 4),  # dense, ring attention
    (2, 8, 1, 1, "1f1b", 1, "7b", 0, 1, 1.25, 1, 2),
    (1, 1, 2, 4, "interleaved", 2, "small", 8, 2, 2.0, 8, 1),
    (4, 1, 1, 2, "1f1b", 1, "small", 4, 1, 1.5, 1, 1),  # experts, no ep
    (1, 2, 4, 4, "gpipe", 1, "7b", 8, 2, 1.25, 2, 2),
    (2, 1, 1, 1, "1f1b", 1, "small", 8, 2, 1.25, 8, 2),
    (1, 4, 2, 2, "1f1b", 1, "70b", 16, 2, 1.25, 4, 2),
    (8, 1, 1, 1, "1f1b", 1, "7b", 0, 1, 1.25, 1, 8),
    (1, 1, 1, 4, "1f1b", 1, "small", 64, 8, 1.25, 16, 1),
)


def variants(i: int, dp: int, tp: int, pp: int, m: int) -> Iterator[dict[str, Any]]:
    """Four settings per layout, turning ZeRO, checkpointing, dtypes, the GPU and
    the rest over the grid: every value of each meets several layouts."""
    for k in range(4):
        j = i + k
        gpu = ("h100", "h200", "a100")[j % 3]
        sheet = SHEETS[gpu] | (CHANGED if j % 5 == 2 else {})
        yield dict(
            sheet,
            gpu=gpu,
            gpus_per_node=(8, 8, 4)[(j // 3) % 3],
            efficiency_bf16=(0.65, 0.65, 0.35)[k % 3],
            zero=str((i + 2 * k) % 4),
            reshard=(i + 2 * k) % 4 != 3 or j % 2 == 0,  # ZeRO-3 kept gathered
            ckpt=("none", "selective", "full")[j % 3],
            sp=tp > 1 and j % 2 == 0,
            dtype=("fp32", "bf16", "amp-bf16")[(i + k) % 3],
            reduce=("fp32", "bf16")[(j // 2) % 2],
            optimizer=("adamw", "adamw-fused", "sgd")[j % 3],
            bucket_view=j % 4 == 1,
            batch=dp * m * (1, 2, 4)[j % 3],
        )


def grid() -> list[dict[str, Any]]:
    """The valid input sets: each layout of LAYOUTS in four settings."""
    cases = []
    for i, (dp, tp, pp, m, schedule, virtual, model) in enumerate(LAYOUTS):
        fixed = dict(zip(SHAPE, MODELS[model], strict=True), dp=dp, tp=tp, pp=pp)
        fixed.update(micro_batches=m)
        fixed.update(schedule=schedule, virtual=virtual, gpus=dp * tp * pp)
        cases += [dict(v, **DENSE, **fixed) for v in variants(i, dp, tp, pp, m)]
    for i, (dp, tp, pp, m, schedule, virtual, model, *moe) in enumerate(AXES):
        fixed = dict(zip(SHAPE, MODELS[model], strict=True), dp=dp, tp=tp, pp=pp)
        fixed.update(zip((*DENSE,), moe, strict=True))
        ep, cp = moe[3], moe[4]
        fixed.update(micro_batches=m, schedule=schedule, virtual=virtual)
        fixed.update(gpus=dp * tp * pp * ep * cp, batch=dp * ep * m * (1 + i % 2))
        cases.append(dict(list(variants(i, dp, tp, pp, m))[i % 4], **fixed))
    return cases


BASE = grid()[16]  # 4 x 2 x 2 on the 7B model, 1F1B, m = 4
IMPOSSIBLE = (  # each breaks one constraint of plan.check or of an input's own
    dict(tp=3, gpus=24),
    dict(gpus=64),
    dict(pp=64, dp=1, tp=1, sp=False, micro_batches=64, gpus=64, batch=64),
    dict(pp=3, tp=1, sp=False, micro_batches=3, gpus=12, batch=12),
    dict(sp=True, tp=1, gpus=8),
    dict(pp=1, gpus=8, schedule="interleaved", virtual=2),
    dict(schedule="interleaved", virtual=2, micro_batches=5),
    dict(micro_batches=1, batch=4),
    dict(batch=30),
    dict(batch=24, micro_batches=4),
    dict(schedule="interleaved", virtual=1),
    dict(virtual=2),
    dict(layers=0),
    dict(hidden=4100),
    dict(vocab=32001),
    dict(seq=4097, sp=True),
    dict(efficiency_fp32=0),
    dict(memory_mib=0),
    dict(node_gbs=-1),
    dict(ep=2, gpus=32),  # no experts to split
    dict(cp=3, gpus=48),  # 4096 tokens are not 6 zig-zag chunks
    dict(experts=8, top_k=9),
    dict(experts=6, ep=4, gpus=64),
    dict(zero="1", reshard=False),
)
CASES = grid() + [dict(BASE, **change) for change in IMPOSSIBLE]


def predict(case: dict[str, Any]) -> dict[str, Any]:
    """distcourse.plan's answer for a case, or {'error': its ValueError's message}."""
    try:
        moe = ("experts", "top_k", "capacity_factor")
        model = plan.ModelSpec(*(case[k] for k in (*SHAPE, *moe)))
        policy = plan.DTypePolicy(case["dtype"], case["reduce"], case["optimizer"])
        keys = ("dp", "tp", "pp", "micro_batches", "ckpt", "schedule", "virtual")
        keys += ("ep", "cp")
        layout = plan.PlanLayout(
            **{k: case[k] for k in keys},
            zero=int(case["zero"]),
            sp=case["sp"],
            bucket_view=case["bucket_view"],
            reshard=case["reshard"],
        )
        hw = hardware(case)
        found = plan.predict(model, case["batch"], policy, layout, hw, case["gpus"])
    except ValueError as err:
        return {"error": str(err)}
    return dict(found.to_dict(), params=model.params)


def hardware(case: dict[str, Any]) -> plan.Hardware:
    """The case's GPU, from the form's units as the page converts them."""
    preset, c = plan.named(case["gpu"]), case
    return plan.Hardware(
        name=preset.name,
        flops_fp32=c["tflops_fp32"] * 1e12,
        flops_bf16=c["tflops_bf16"] * 1e12,
        efficiency_fp32=float(c["efficiency_fp32"]),
        efficiency_bf16=float(c["efficiency_bf16"]),
        bandwidth=c["bandwidth_tbs"] * 1e12,
        efficiency_memory=float(c["efficiency_memory"]),
        memory=int(c["memory_mib"] * MIB),
        workspace=int(c["workspace_mib"] * MIB),
        context=int(c["context_mib"] * MIB),
        nccl=int(c["nccl_mib"] * MIB),
        gpus_per_node=c["gpus_per_node"],
        alpha_node=c["alpha_node_us"] / 1e6,
        beta_node=1 / (c["node_gbs"] * GB),
        alpha_network=c["alpha_network_us"] / 1e6,
        beta_network=1 / (c["network_gbs"] * GB),
        arch=preset.arch,
        source=preset.source,
    )


# Types each case into the form, field by field, and reads what the page shows.
TYPE_AND_READ = """(cases) => cases.map(c => {
  const root = document.getElementById('dc-planner');
  const form = root.querySelector('form');
  for (const [name, value] of c) {
    const e = form.elements[name];
    if (e.type === 'checkbox') e.checked = value; else e.value = String(value);
    e.dispatchEvent(new Event('input', {bubbles: true}));
  }
  const error = root.querySelector('.dc-plan-error');
  if (!error.hidden) return {error: error.querySelector('[data-key=error]')
    .dataset.value, shown: error.innerText};
  const out = {};
  for (const e of root.querySelectorAll('.dc-plan-outputs [data-key]'))
    out[e.dataset.key] = e.dataset.value;
  return out;
})"""


def flat(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """('memory.total', 123), ('by_rank.0.activations', ...) ... of a to_dict."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flat(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flat(v, f"{key}.{i}")
    else:
        yield key, value


def differences(want: dict[str, Any], shown: dict[str, str]) -> list[str]:
    """Every number of `want` (the outputs, not the echoed inputs) the page shows
    otherwise: ints exact, floats to 1e-9 relative, booleans as true / false."""
    echo = ("model.", "policy.", "layout.", "hardware.", "batch")
    bad = []
    for key, value in flat(want):
        if key.startswith(echo):
            continue
        bar = key.startswith("time.") and key != "time.total"  # drawn and listed
        keys = [key] + ([f"bar.{key}"] if bar else [])
        for k in keys:
            got = shown.get(k)
            if isinstance(value, bool):
                ok = got == str(value).lower()
            elif isinstance(value, str):
                ok = got == value
            elif isinstance(value, int):
                ok = got is not None and int(got) == value
            else:
                ok = got is not None and math.isclose(float(got), value, rel_tol=1e-9)
            if not ok:
                bad.append(f"{k}: Python {value!r}, page {got!r}")
    return bad


@contextlib.contextmanager
def planner(browser: Any, site: str) -> Iterator[Any]:  # noqa: F811 (fixtures)
    """The planner page, loaded, its form built; no console error by its close."""
    tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(f"{site}/{PAGE}", wait_until="load", timeout=LOAD_MS)
    tab.wait_for_selector("#dc-planner form", timeout=LOAD_MS)
    yield tab
    tab.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def page(browser: Any, site: str) -> Iterator[Any]:  # noqa: F811 (fixtures)
    """The planner page, loaded once for the module's grid."""
    with planner(browser, site) as tab:
        yield tab


def test_the_grid_covers_every_setting() -> None:
    """At least 50 valid input sets, each setting in several values, every
    impossible one refused by the Python for a reason of its own."""
    valid = [c for c in CASES if "error" not in predict(c)]
    assert len(valid) >= 50 and len(CASES) - len(valid) == len(IMPOSSIBLE)
    assert len({str(sorted(c.items())) for c in CASES}) == len(CASES)
    for key in ORDER:
        assert len({c[key] for c in valid}) > 1, key
    settings = (("zero", 4), ("ckpt", 3), ("schedule", 3), ("gpu", 3), ("dtype", 3))
    for key, values in (*settings, ("optimizer", 3)):
        assert len({c[key] for c in valid}) == values, key
    errors = {predict(c)["error"] for c in CASES[len(valid) :]}
    assert len(errors) == len(IMPOSSIBLE), errors
    for gpu, sheet in SHEETS.items():  # the form's units give the presets exactly
        assert hardware(dict(sheet, gpu=gpu)) == plan.GPUS[gpu]


def test_the_page_equals_the_python_planner(page: Any) -> None:
    typed = [[(k, c[k]) for k in ORDER] for c in CASES]
    shown = page.evaluate(TYPE_AND_READ, typed)
    bad = []
    for case, got in zip(CASES, shown, strict=True):
        want = predict(case)
        if "error" in want:
            same = got.get("error") == want["error"] and want["error"] in got["shown"]
            problems = [] if same else [f"error {want['error']!r}, page {got}"]
        else:
            problems = ["page: " + got["error"]] if "error" in got else []
            problems = problems or differences(want, got)
        bad += [f"{case}: {p}" for p in problems[:3]]
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:20])


def test_presets_are_the_python_ones(page: Any) -> None:
    """The GPUs' figures and the model presets are the package's, to the bit."""
    gpus = page.evaluate("Object.fromEntries(Object.entries(window.dcPlan.GPUS))")
    assert gpus == {k: hw.to_dict() for k, hw in plan.GPUS.items()}
    for preset, params in PRESETS.items():
        shape = page.evaluate(
            """(p) => { const f = document.querySelector('#dc-planner form');
              f.elements.preset.value = p;
              f.elements.preset.dispatchEvent(new Event('input', {bubbles: true}));
              return ['layers', 'hidden', 'heads', 'seq', 'vocab']
                .map(k => Number(f.elements[k].value)); }""",
            preset,
        )
        assert shape == list(plan.ModelSpec.from_params(params).to_dict().values())


# FSDP's reshard_after_forward=False (a ZeRO-3 setting of PlanLayout) and the
# per-micro-batch charges of ZeRO-2/3 in bf16, through window.dcPlan.predict
# itself: model shape, batch, dtype, reduce, layout.
DIRECT = (
    ("7b", 64, "bf16", "bf16", dict(dp=8, zero=3, reshard=False)),
    ("7b", 64, "bf16", "fp32", dict(dp=8, zero=3, reshard=False, micro_batches=8)),
    ("small", 32, "fp32", "fp32", dict(dp=2, pp=2, zero=3, reshard=False)),
    ("7b", 64, "bf16", "bf16", dict(dp=8, zero=2, micro_batches=8)),
    ("7b", 64, "bf16", "fp32", dict(dp=4, pp=2, zero=1, micro_batches=8)),
    ("70b", 64, "bf16", "fp32", dict(dp=4, tp=4, zero=3, micro_batches=4)),
    ("small", 32, "fp32", "fp32", dict(dp=4, zero=2, reshard=False)),
)
PREDICT = """(cases) => cases.map(([shape, batch, dtype, reduce, layout]) => {
  const P = window.dcPlan, big = (o) => Object.fromEntries(Object.entries(o)
    .map(([k, v]) => [k, typeof v === 'number' ? BigInt(v) : v]));
  const keys = ['layers', 'hidden', 'heads', 'seq', 'vocab'];
  const plain = {tp: 1, pp: 1, micro_batches: 1, schedule: '1f1b', virtual: 1,
    ckpt: 'none', sp: false, bucket_view: false, ...layout};
  const data = {model: big(Object.fromEntries(keys.map((k, i) => [k, shape[i]]))),
    batch: BigInt(batch), policy: {dtype, reduce, optimizer: 'adamw'},
    layout: big(plain), hardware: P.GPUS.h100};
  try {
    const p = P.predict(data, null), out = {};
    for (const part of ['memory', 'peak', 'time', 'messages', 'wire'])
      for (const [k, v] of Object.entries(p[part])) out[`${part}.${k}`] = String(v);
    out.flops = String(p.flops);
    return out;
  } catch (err) { return {error: err.message}; }
})"""


def test_layouts_beyond_the_form_equal_the_python(page: Any) -> None:
    shown = page.evaluate(
        PREDICT, [[MODELS[m], b, d, r, lay] for m, b, d, r, lay in DIRECT]
    )
    for (name, batch, dtype, reduce, fields), got in zip(DIRECT, shown, strict=True):
        model = plan.ModelSpec(*MODELS[name])
        policy = plan.DTypePolicy(dtype, reduce)
        try:
            layout = plan.PlanLayout(**fields)
            found = plan.predict(model, batch, policy, layout, plan.GPUS["h100"])
        except ValueError as err:
            assert got == {"error": str(err)}
            continue
        want = found.to_dict()
        for part in ("memory", "peak", "time", "messages", "wire"):
            for key, value in want[part].items():
                ok = math.isclose(float(got[f"{part}.{key}"]), value, rel_tol=1e-9)
                exact = isinstance(value, float) or int(got[f"{part}.{key}"]) == value
                assert ok and exact, (fields, part, key, value, got)
        assert int(got["flops"]) == want["flops"]
    assert shown[-1]["error"].startswith("reshard=False (FSDP's")


# ---------------------------------------------------------- the page's tools ----
# What a reader reaches for beyond one prediction (issue 53): the form and its
# results on one screen, dp that follows the GPU count, the fastest layout that
# fits (plan.search, run by the page), a sweep, two layouts side by side, a time
# axis the same for every input, labels clear of the bars, sizes in GiB, and
# plain words for a field without a number.

TYPE = """(fields) => { const f = document.querySelector('#dc-planner form');
  for (const [name, value] of fields) { const e = f.elements[name];
    if (e.type === 'checkbox') e.checked = value; else e.value = String(value);
    e.dispatchEvent(new Event('input', {bubbles: true})); } }"""
# the numbers the page shows whose data-key begins with a prefix
READ = """(prefix) => Object.fromEntries([...document.querySelectorAll(
  '#dc-planner [data-key]')].filter(e => e.dataset.key.startsWith(prefix))
  .map(e => [e.dataset.key, e.dataset.value]))"""
ERROR = """() => { const e = document.querySelector('#dc-planner .dc-plan-error');
  return e.hidden ? null : e.innerText; }"""
VALID = [c for c in grid() if "error" not in predict(c)]


@pytest.fixture
def tab(browser: Any, site: str) -> Iterator[Any]:  # noqa: F811 (fixtures)
    """A fresh planner page (nothing typed yet)."""
    with planner(browser, site) as fresh:
        yield fresh


def typed(case: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, case[k]) for k in ORDER]


def refusal(
    model: plan.ModelSpec, batch: int, layout: plan.PlanLayout, gpus: int
) -> str:
    """The ValueError plan.check raises for an impossible layout."""
    with pytest.raises(ValueError) as err:
        plan.check(model, batch, layout, gpus)
    return str(err.value)


def test_the_form_and_its_results_fit_one_screen(tab: Any) -> None:
    """At 1280 x 900, as the page opens: the whole form, the summary and both
    charts, nothing scrolled; and so after the search puts a 4-stage pipeline in
    the form (the 70B model on 64 GPUs)."""
    where = """() => Object.fromEntries(['#dc-planner form', '.dc-plan-summary',
      '.dc-plan-memory svg', '.dc-plan-time svg'].map(s => {
        const r = document.querySelector(s).getBoundingClientRect();
        return [s, [r.top, r.bottom]]; }))"""
    for step in ("opened", "70B on 64 GPUs, searched"):
        if step != "opened":
            tab.evaluate(TYPE, [("preset", "70b")])
            tab.click(".dc-plan-inputs .dc-plan-find")
            assert int(tab.evaluate("document.querySelector('#dc-plan-pp').value")) > 1
            tab.evaluate("window.scrollTo(0, 0)")
        boxes = tab.evaluate(where)
        off = {k: v for k, v in boxes.items() if v[0] < 0 or v[1] > HEIGHT}
        assert not off, f"{step}: past the {HEIGHT}-px window: {off}"


def test_dp_follows_the_gpus_until_it_is_pinned(tab: Any) -> None:
    def dp() -> str:
        return tab.evaluate("document.querySelector('#dc-plan-dp').value")

    assert dp() == "16" and tab.evaluate(ERROR) is None  # 64 GPUs / (tp 2 x pp 2)
    tab.evaluate(TYPE, [("gpus", 128)])
    assert dp() == "32" and tab.evaluate(ERROR) is None
    assert tab.evaluate(READ, "gpus") == {"gpus": "128"}
    tab.evaluate(TYPE, [("tp", 4)])
    assert dp() == "16" and tab.evaluate(ERROR) is None
    tab.evaluate(TYPE, [("dp", 8), ("gpus", 256)])  # typed: pinned
    assert tab.evaluate("document.querySelector('#dc-plan-dp_pinned').checked")
    model = plan.ModelSpec.from_params(7e9)
    want = refusal(model, 256, plan.PlanLayout(dp=8, tp=4, pp=2, micro_batches=8), 256)
    assert want in tab.evaluate(ERROR), tab.evaluate(ERROR)
    tab.evaluate(TYPE, [("dp_pinned", False)])  # unpinned: it follows again
    assert dp() == "32" and tab.evaluate(ERROR) is None


# model, batch, dtype, reduce, optimizer, GPU, GPUs, chapter 12's fields
SEARCHES = (
    ("7b", 64, "bf16", "bf16", "adamw", "h100", 8, {}),
    ("70b", 256, "bf16", "fp32", "adamw", "h100", 64, {}),
    ("small", 32, "fp32", "fp32", "sgd", "a100", 16, {}),
    ("7b", 512, "amp-bf16", "fp32", "adamw-fused", "h200", 32, {}),
    ("small", 16, "bf16", "bf16", "adamw", "h200", 8, dict(experts=8, top_k=2, ep=2)),
    ("70b", 64, "bf16", "fp32", "adamw", "h100", 8, {}),  # nothing fits
    ("small", 4, "fp32", "fp32", "adamw", "h100", 3, {}),  # no layout at all
)
SEARCHED = """() => { document.querySelector('.dc-plan-inputs .dc-plan-find').click();
  const s = window.dcPlannerState.search;
  return s && s.map(p => [window.dcPlan.layoutKey(p.layout), String(p.memory.total),
    p.time.total]); }"""
LAYOUT_FIELDS = (
    "dp tp pp micro_batches zero sp ckpt schedule virtual bucket_view ep cp reshard"
).split()


def layout_key(layout: plan.PlanLayout) -> str:
    """window.dcPlan.layoutKey of the same layout."""
    values = (getattr(layout, k) for k in LAYOUT_FIELDS)
    return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)


def search_case(row: tuple) -> dict[str, Any]:
    """BASE with a row of SEARCHES typed over it (its layout then matters not)."""
    name, batch, dtype, reduce, optimizer, gpu, gpus, moe = row
    case = dict(BASE, **SHEETS[gpu], gpu=gpu, gpus=gpus, batch=batch, **moe)
    case.update(zip(SHAPE, MODELS[name], strict=True))
    return dict(case, dtype=dtype, reduce=reduce, optimizer=optimizer)


def test_the_page_finds_the_layouts_plan_search_finds(tab: Any) -> None:
    """The page's search lists the layouts `plan.search` returns, in its order
    (ties aside), puts the fastest in the form and shows the next ones; where no
    layout suits, the Python's message."""
    bad = []
    for row in SEARCHES:
        case = search_case(row)
        tab.evaluate(TYPE, typed(case))
        got = tab.evaluate(SEARCHED)
        moe = ("experts", "top_k", "capacity_factor")
        model = plan.ModelSpec(*(case[k] for k in (*SHAPE, *moe)))
        policy = plan.DTypePolicy(case["dtype"], case["reduce"], case["optimizer"])
        fixed = (
            dict(ep=case["ep"], cp=case["cp"]) if case["ep"] * case["cp"] > 1 else None
        )
        try:
            found = plan.search(
                model, case["batch"], policy, hardware(case), case["gpus"], fixed
            )
        except ValueError as err:
            shown = tab.evaluate(READ, "search.error")
            if got is not None or shown.get("search.error") != str(err):
                bad.append(f"{row}: Python {err}, page {got} {shown}")
            continue
        want = [
            (layout_key(p.layout), p.memory["total"], p.time["total"]) for p in found
        ]
        if len(got) != len(want) or sorted(k for k, *_ in got) != sorted(
            k for k, *_ in want
        ):
            bad.append(f"{row}: {len(got)} layouts, Python {len(want)} (or others)")
            continue
        for i, ((_, mem, secs), (_, gmem, gsecs)) in enumerate(
            zip(want, got, strict=True)
        ):
            if int(gmem) != mem or not math.isclose(gsecs, secs, rel_tol=1e-9):
                bad.append(
                    f"{row}: #{i} Python {mem} B {secs} s, page {gmem} B {gsecs} s"
                )
                break
        shown = tab.evaluate(READ, "")
        if not want:
            if shown.get("search.count") != "0":
                bad.append(
                    f"{row}: nothing fits, the page says {shown.get('search.count')}"
                )
            continue
        if sideways := tab.evaluate(SIDEWAYS, [BLOCKS, None]):
            bad.append(f"{row}: the list scrolls sideways: {sideways}")
        listed = [shown.get(f"search.{i}.layout") for i in range(min(5, len(got)))]
        if listed != [k for k, *_ in got[:5]] or shown["search.count"] != str(
            len(want)
        ):
            bad.append(f"{row}: the list shows {listed}")
        best = found[0].to_dict()  # now in the form, and predicted there
        if int(shown["memory.total"]) != best["memory"]["total"] or not math.isclose(
            float(shown["time.total"]), best["time"]["total"], rel_tol=1e-9
        ):
            bad.append(f"{row}: the form's prediction is not the fastest layout's")
    assert not bad, "\n".join(bad)


SWEPT = """(over) => {
  const s = document.querySelector('#dc-planner select[name=sweep]');
  s.value = over; s.dispatchEvent(new Event('change', {bubbles: true}));
  const xs = '#dc-planner [data-key^="sweep."][data-key$=".x"]';
  return [...document.querySelectorAll(xs)]
    .map(e => [e.dataset.value, e.dataset.error ?? null, e.dataset.fits ?? null]); }"""
FACTORS = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8)


def test_the_sweep_is_the_planners_at_every_point(tab: Any) -> None:
    """Memory and time against the sequence length and the global batch: every
    point's x, peak bytes, seconds and fit as `plan.predict`'s, and an impossible
    point refused with the Python's message."""
    bad = []
    for case in VALID[::7]:
        tab.evaluate(TYPE, typed(case))
        for over in ("seq", "batch"):
            points = tab.evaluate(SWEPT, over)
            shown = tab.evaluate(READ, "sweep.")
            xs = [case[over] * f for f in FACTORS]
            xs = [int(x) for x in xs if x == int(x) and x >= 1]
            if [int(float(x)) for x, *_ in points] != xs:
                bad.append(f"{over} of {case}: x {points}, want {xs}")
                continue
            for i, (x, (_, error, fits)) in enumerate(zip(xs, points, strict=True)):
                want = predict(dict(case, **{over: x}))
                if "error" in want:
                    ok = error == want["error"]
                else:
                    ok = (
                        fits == str(want["fits"]).lower()
                        and int(shown[f"sweep.{i}.memory.total"])
                        == want["memory"]["total"]
                        and math.isclose(
                            float(shown[f"sweep.{i}.time.total"]),
                            want["time"]["total"],
                            rel_tol=1e-9,
                        )
                    )
                if not ok:
                    bad.append(f"{over}={x} of {case}: Python {want}, page {points[i]}")
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:10])


def test_two_layouts_side_by_side_are_the_planners(tab: Any) -> None:
    a, b = VALID[3], VALID[40]
    tab.evaluate(TYPE, typed(b))
    tab.click(".dc-plan-keep")
    tab.evaluate(TYPE, typed(a))
    shown = tab.evaluate(READ, "compare.")
    for side, case in (("a", a), ("b", b)):
        want = predict(case)
        got = {k.split(".", 2)[2]: v for k, v in shown.items() if k[8] == side}
        assert int(got["memory.total"]) == want["memory"]["total"], (side, got)
        assert int(got["wire"]) == sum(want["wire"].values()), (side, got)
        for key in ("time.total", "tokens_per_s", "mfu"):
            value = want[key] if "." not in key else want["time"]["total"]
            assert math.isclose(float(got[key]), value, rel_tol=1e-9), (side, key)
    sideways = tab.evaluate(SIDEWAYS, [BLOCKS, None])
    assert not sideways, f"the comparison scrolls sideways: {sideways}"
    tab.click(".dc-plan-load")  # B back in the form
    assert (
        int(tab.evaluate(READ, "memory.total")["memory.total"])
        == predict(b)["memory"]["total"]
    )


AXIS = """() => { const s = document.querySelector('#dc-planner .dc-plan-time svg');
  const rects = [...s.querySelectorAll('.dc-plan-bar rect')];
  const end = Math.max(...rects.map(
    r => +r.getAttribute('x') + +r.getAttribute('width')));
  const ticks = Object.fromEntries([...s.querySelectorAll('[data-tick]')]
    .map(t => [t.dataset.tick, +t.getAttribute('x')]));
  return {end, ticks}; }"""


def test_the_time_bar_is_on_one_axis_for_every_input(tab: Any) -> None:
    """The bar ends where its seconds are on a logarithmic axis whose decades
    stay put: a step near 2 s and one near 40 s end a decade and more apart."""
    totals = [(predict(c)["time"]["total"], c) for c in VALID]
    short = min(totals, key=lambda t: abs(math.log(t[0] / 1.95)))
    long = min(totals, key=lambda t: abs(math.log(t[0] / 38.5)))
    assert long[0] / short[0] > 10, (short[0], long[0])
    seen = []
    for seconds, case in (short, long):
        tab.evaluate(TYPE, typed(case))
        got = tab.evaluate(AXIS)
        one, ten = got["ticks"]["0"], got["ticks"]["1"]  # 1 s and 10 s
        want = one + (ten - one) * math.log10(seconds)
        assert abs(got["end"] - want) < 0.5, (seconds, got, want)
        seen.append(got)
    assert seen[0]["ticks"] == seen[1]["ticks"]
    gap = seen[1]["end"] - seen[0]["end"]
    assert gap > (seen[0]["ticks"]["1"] - seen[0]["ticks"]["0"]), seen


CLEAR = """() => { const out = [];
  for (const s of document.querySelectorAll('#dc-planner .dc-plan-chart svg')) {
    const box = s.getBoundingClientRect();
    const bars = [...s.querySelectorAll('.dc-plan-bar rect')]
      .map(r => r.getBoundingClientRect()).filter(r => r.width > 0);
    for (const t of s.querySelectorAll('text')) {
      if (t.getAttribute('display') === 'none') continue;
      const b = t.getBoundingClientRect();
      if (b.left < box.left - 1 || b.right > box.right + 1)
        out.push('cut: ' + t.textContent);
      if (bars.some(r => b.left < r.right - 0.5 && r.left < b.right - 0.5
          && b.top < r.bottom - 0.5 && r.top < b.bottom - 0.5))
        out.push('on a bar: ' + t.textContent);
    }
  }
  const text = document.querySelector('#dc-planner .dc-plan-outputs').innerText;
  return [out, text]; }"""


def test_labels_stay_clear_of_bars_and_sizes_read_in_gib(tab: Any) -> None:
    """On every other valid input of the grid (every layout, two settings): no
    label of a chart on a bar or cut at its edge, and no byte count written out
    as a raw integer (seven digits and more without separators: sizes are in
    GiB)."""
    bad = []
    for case in VALID[::2]:
        tab.evaluate(TYPE, typed(case))
        labels, text = tab.evaluate(CLEAR)
        raw = re.findall(r"(?<![\d,.])\d{7,}", text)
        bad += [f"{case['dp']}x{case['tp']}x{case['pp']}: {x}" for x in labels + raw]
    assert not bad, "\n".join(bad[:20])


def test_a_field_without_a_number_is_named_in_plain_words(tab: Any) -> None:
    """Letters typed into a number field (the browser keeps none, or an 'e' it
    cannot read), or a field left empty: the field is named, with what to type."""
    for field, label, what in (
        ("gpus", '"GPUs"', "a whole number (e.g. 64)"),
        ("memory_mib", '"memory (MiB, as nvidia-smi)"', "a number (e.g. 81559)"),
    ):
        tab.click(f"#dc-plan-{field}")
        tab.keyboard.press("Control+A")
        tab.keyboard.type("1e")
        shown = tab.evaluate(ERROR)
        assert f"{label} holds something that is not a number: type {what}" in shown
        tab.keyboard.press("Control+A")
        tab.keyboard.type("abc")
        shown = tab.evaluate(ERROR)
        assert f"{label} is empty: type {what}" in shown, shown
        assert "got ''" not in shown
        tab.keyboard.type("8")
        assert tab.evaluate(ERROR) is None or label not in tab.evaluate(ERROR)


def test_the_label_and_size_checks_catch_what_they_must(tab: Any) -> None:
    """CLEAR flags a label drawn on a bar and one cut at the chart's edge, and the
    size check a byte count written out whole."""
    tab.evaluate(
        """() => {
      const s = document.querySelector('#dc-planner .dc-plan-memory svg');
      const bar = s.querySelector('.dc-plan-bar rect');
      const on = document.createElementNS('http://www.w3.org/2000/svg', 'text');
      on.setAttribute('x', +bar.getAttribute('x') + 2);
      on.setAttribute('y', +bar.getAttribute('y') + 10);
      on.textContent = 'on';
      const cut = on.cloneNode();
      cut.setAttribute('x', +s.getAttribute('width') - 3);
      cut.textContent = 'cut';
      s.append(on, cut);
      document.querySelector('#dc-planner .dc-plan-summary')
        .append(' 85520000000 bytes');
    }"""
    )
    labels, text = tab.evaluate(CLEAR)
    assert "on a bar: on" in labels and "cut: cut" in labels, labels
    assert re.findall(r"(?<![\d,.])\d{7,}", text) == ["85520000000"]
