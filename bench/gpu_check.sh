#!/usr/bin/env bash
# The GPU check that every session with a GPU runs first: bench/gpu_check.py (its docstring says what it runs).
#
#   here, once:  bash bench/gpu_check.sh --wheels   # the wheels the device lacks (diffusers) into .whl/ (ignored)
#   device run:  bash bench/gpu_check.sh            # carry [".whl"], timeout_s 560; the JSON comes back in $OUT
#   on a CPU:    bash bench/gpu_check.sh --tiny     # the same steps at policy.size="tiny"
#   then, on the same warm machine (timeout_s 560), the speed candidates against today's defaults, one prompt an
#   iteration (each builds the model and runs two iterations; those past the budget are recorded as skipped):
#                bash bench/gpu_check.sh --variants base,checkpoint-half,torch-flash,batch16,compile --prompts 1 \
#                    --iterations 2 --budget 500
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(diffusers==0.42.1 importlib_metadata==8.7.0)
if [ "${1:-}" = "--wheels" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl "${WHEELS[@]}"
    ls .whl
    exit 0
fi
if ! python3 -c "import diffusers" 2>/dev/null; then
    [ -d .whl ] || { echo "diffusers is not installed and no .whl/ was carried: run 'bash bench/gpu_check.sh --wheels' here first" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 bench/gpu_check.py "$@"
