#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a lent device, in under 8 minutes on one H200.
#
# The device machine reaches no registry, and its image has torch but not ortools: fetch
# ortools' wheel here first, into the ignored folder .whl (the device README's recipe):
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d .whl ortools==9.14.6206 immutabledict
# then run this script there with .whl carried. Its output also lands in $OUT/gpu_check.log
# (or ./gpu_check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 470 python3 benchmarks/gpu_check.py "$@" 2>&1 | tee "${OUT:-.}/gpu_check.log"
