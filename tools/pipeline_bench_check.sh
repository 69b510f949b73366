#!/usr/bin/env bash
# The pipeline benchmark on an idle machine (issue 25 item 2), from the repository root,
# on the torch that machine has (2.11 or newer; needs no ipyparallel, no network):
#
#   bash tools/pipeline_bench_check.sh      # a minute or two on 16 idle cores
#
# Prints the machine (cores, load before and after), then the 2-rank sweep of `python -m
# distcourse.bench pipeline --two` as a table and as JSON (efficiency at the best m: an
# ideal pipeline of the same stages over the measured step; per_micro_batch_ms: the
# compute an extra micro-batch adds to a stage), then the whole benchmark (its 4-rank
# part runs torch's zero-bubble schedule, which older torch may refuse on gloo: that
# step may fail without failing the check). Each rank runs one thread, so 2 ranks use 2
# of the cores and 4 ranks 4: nothing is oversubscribed. Exit code 1 if efficiency at
# the best m is below 0.85.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DISTCOURSE_DEVICE=cpu OMP_NUM_THREADS=1
echo "cores $(nproc --all); torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
echo "before: $(uptime)"
"$PYTHON" -m distcourse.bench pipeline --two || exit 2
json=$("$PYTHON" -m distcourse.bench pipeline --two --json) || exit 2
echo "$json"
echo "the whole benchmark (4 ranks too):"
"$PYTHON" -m distcourse.bench pipeline || echo "(the 4-rank part failed on this torch)"
echo "after: $(uptime)"
"$PYTHON" - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"best m={r['m']}: speed-up {r['speedup']}, efficiency {r['efficiency']} "
      f"(ideal {r['ideal_ms']} ms / measured), load {r['load']} on {r['cpus']} CPUs")
sys.exit(0 if r["efficiency"] >= 0.85 else 1)
PY
