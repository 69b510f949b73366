#!/usr/bin/env bash
# The GPU box check (issue 24): run on a machine with one or more NVIDIA GPUs, from the
# repository root, on the torch that machine already has (2.11 or newer):
#
#   bash tools/gpu_check.sh                  # about a minute on one H200
#   GPU_CHECK_UNIT=1 bash tools/gpu_check.sh # and the unit tests: 2 more minutes
#
# A box without network: put the pure-Python packages it lacks (ipyparallel, nbclient,
# ... ; `bash tools/gpu_wheels.sh` downloads them on a machine with network) in .whl/ and
# they are installed into a private folder first. Nothing is written to the book (the
# traces and measure steps write under tests/data/, for a commit).
# Steps, each reported PASS or FAIL with its time in one summary at the end (logs and
# the book run's report under $OUT, default _build/gpu_check):
#   check     python -m distcourse check (versions, GPUs, a 2-rank all_reduce)
#   device    python -m distcourse.devicecheck (no CPU-only tensor meets a collective)
#   gpu-suite pytest tests/gpu: every strategy on the GPUs against one process, at
#             every world size of 1, 2, 4, 8 up to the GPU count (one GPU a rank)
#   book      make test-gpu: every chapter that fits the GPUs here, on NCCL ranks
#   traces    the GPU suite again at world size 1, each rank recording what it
#             dispatched and sent (distcourse.emulate.recorder), into $TRACES/gpu-suite
#   programs  tools/record_traces.py: TinyGPT under bf16 autocast (one process) and
#             chapter 1's DDP program (book/scripts/quickstart_ddp.py's training, one
#             NCCL rank), recorded into $TRACES; TRACES defaults to
#             tests/data/gpu_traces/<date>-<gpu>: commit that folder, and
#             tests/test_emulate_recorder.py diffs the emulated box against it
#   measure   python -m distcourse.plan.phases: TinyGPT steps (12 x 768 and 24 x 2048,
#             fp32 and bf16 autocast), memory per phase by max_memory_allocated and
#             the step's time, beside the planner's prediction; appends the rows to
#             tests/data/gpu_measurements.json (commit it: tests/test_plan_phases.py
#             holds the planner to every row)
#   trainer   book/scripts/train_gpt.py --model gpt2-124m --dtype bf16 (batch 8 x 1024,
#             30 steps) without torchrun on GPU 0: tokens/s, MFU and the measured peak
#             beside the planner's from its metrics (under $OUT/trainer.jsonl)
#   bench-trainer  python -m distcourse.bench trainer --dtype bfloat16: the trainer's
#             step against nanoGPT's plain loop on the same model, batch and GPU
#   unit      (GPU_CHECK_UNIT=1 only) the CPU unit tests on this torch, 8 at a time
# (Without a GPU, `make test-gpu` runs both on an emulated GPU box instead.)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-_build/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" .whl/*.whl || { echo "installing .whl/ failed"; exit 2; }
    export PYTHONPATH="$PYTHONPATH:$site"
fi
export IPYTHONDIR="$(mktemp -d)"

declare -a names results
step() {  # step NAME COMMAND...: run it, log it, remember PASS/FAIL and the time
    local name=$1; shift
    local start=$SECONDS
    echo "=== $name: $*"
    if "$@" 2>&1 | tee "$OUT/$name.log"; then
        results+=("PASS $((SECONDS - start))s")
    else
        results+=("FAIL $((SECONDS - start))s")
    fi
    names+=("$name")
}

"$PYTHON" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY
step check "$PYTHON" -m distcourse check
step device "$PYTHON" -m distcourse.devicecheck
# as `make test-gpu` (make test-gpu-suite, make test-gpu-book), without needing make
step gpu-suite env DISTCOURSE_GPU_SUITE_DEVICE=cuda "$PYTHON" -m pytest tests/gpu -rs \
    -p no:cacheprovider
step book env DISTCOURSE_DEVICE=cuda "$PYTHON" -m distcourse.launch.bookrun \
    --out "$OUT/bookrun" --timeout 180
# Traces of this GPU for the emulated box to be held to (tests/data/gpu_traces/).
gpu=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0).split()[-1].lower()
      if torch.cuda.is_available() else "no-gpu")')
TRACES=${TRACES:-tests/data/gpu_traces/$(date -u +%F)-$gpu}
step traces env DISTCOURSE_GPU_SUITE_DEVICE=cuda DISTCOURSE_TRACE_DIR="$TRACES/gpu-suite" \
    "$PYTHON" -m pytest tests/gpu -q -rs -p no:cacheprovider -k world1
step programs "$PYTHON" tools/record_traces.py "$TRACES" --device cuda
step measure "$PYTHON" -m distcourse.plan.phases --append tests/data/gpu_measurements.json
# Chapter 13's trainer on GPU 0 without torchrun: GPT-2 124M's shape in bf16, batch 8 x
# 1024 (the BPE of the book and this machine's Python where tokenizers is installed,
# the book's characters otherwise); its last metrics record, then the trainer against
# nanoGPT's plain loop (python -m distcourse.bench trainer: step-time ratio, MFU).
CORPUS=$("$PYTHON" -c 'import tokenizers' 2>/dev/null && echo bpe || echo chars)
step trainer "$PYTHON" book/scripts/train_gpt.py --model gpt2-124m --batch 8 \
    --seq 1024 --dtype bf16 --steps 30 --warmup 5 --corpus "$CORPUS" --quiet \
    --metrics "$OUT/trainer.jsonl"
"$PYTHON" - "$OUT/trainer.jsonl" <<'PY'
import json, sys
try:
    row = json.loads(open(sys.argv[1]).read().splitlines()[-1])
except (OSError, IndexError):
    sys.exit("trainer: no metrics record")
peak = max(b for b in row["peak_bytes"] if b is not None)
plan = max((b for b in row["planned_bytes"] or [] if b is not None), default=None)
mfu = "-" if row["mfu"] is None else f"{row['mfu']:.3f}"
versus = f", planned {plan / 2**30:.2f} GiB ({peak / plan:.2f} x)" if plan else ""
print(f"trainer step {row['step']}: {row['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, "
      f"{row['step_ms']:.1f} ms a step; peak {peak / 2**30:.2f} GiB{versus}")
PY
step bench-trainer "$PYTHON" -m distcourse.bench trainer --dtype bfloat16
# The CPU unit tests on the box's own torch, 8 at a time (pytest-xdist), capped at 5
# minutes. Left out: the browser test, the GPU suite (above), and what checks that the
# environment is the locked one (envcheck, import-linter's command): a GPU image is not.
if [ "${GPU_CHECK_UNIT:-0}" = 1 ]; then
    step unit timeout 300 "$PYTHON" -m pytest tests -q -p no:cacheprovider -n 8 \
        --ignore=tests/test_book_browser.py --ignore=tests/test_book_browser_planner.py \
        --ignore=tests/gpu \
        --ignore=tests/test_envcheck.py \
        --deselect tests/test_architecture.py::test_import_linter_contracts_hold
fi

echo
echo "GPU check summary ($(date -u +%Y-%m-%dT%H:%MZ)):"
status=0
for i in "${!names[@]}"; do
    printf '  %-10s %s\n' "${names[$i]}" "${results[$i]}"
    case ${results[$i]} in FAIL*) status=1 ;; esac
done
[ -f "$OUT/bookrun/report.txt" ] && sed 's/^/  /' "$OUT/bookrun/report.txt"
[ -d "$TRACES" ] && echo "  traces recorded in $TRACES (commit them with the report)"
exit $status
