#!/usr/bin/env bash
# Download, into .whl/, the pure-Python (and manylinux) packages that tools/gpu_check.sh
# needs on a GPU box without network and that GPU images lack: ipyparallel, nbclient,
# nbformat, ipykernel, jupyter_client, nbval, import-linter and what they need, at requirements.lock's
# versions, for the box's Python (default 3.12). Packages such images already have
# (pytest, psutil, packaging, ...) are left out: theirs are used.
#   bash tools/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
lock=$(mktemp)
grep -v -E '^(#|torch|torchvision|nvidia|cuda|triton)' requirements.lock >"$lock"
rm -rf .whl && mkdir .whl
platforms=()
for tag in manylinux_2_{17,24,26,27,28,31,34}_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download -q --only-binary=:all: --python-version "$version" \
    --implementation cp "${platforms[@]}" -c "$lock" -d .whl \
    ipyparallel nbclient nbformat ipykernel jupyter_client nbval import-linter
# what GPU images ship already (see the device notes): keep theirs
rm -f .whl/{pytest,pluggy,iniconfig,coverage,packaging,psutil,typing_extensions}-*.whl \
    .whl/{python_dateutil,six,tzdata,tqdm}-*.whl
du -sh .whl
