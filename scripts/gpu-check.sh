#!/usr/bin/env bash
# autotune on a real GPU, stage by stage: the CUDA tests, a real out-of-memory study, precisions
# and memory formats side by side, the shapes study end to end, and process isolation's cost.
#
#   bash scripts/gpu-check.sh [tests|oom|precision|study|confirm|isolation ...] [--cpu] [--rounds N]
#                             [--objective goodput|systems_only]
#
# Each stage takes under 8 minutes on one modern GPU and can be run on its own; each writes
# benchmarks/results/gpu-check-STAGE-cuda.json and prints a Markdown summary. Without a GPU it
# says so and checks nothing. It uses ./.venv where there is one (scripts/setup.sh), else the
# python3 on PATH with autotune installed (for a machine without network, see docs/reference.md,
# "Installing on a machine without network").
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
exec "$py" -m benchmarks.gpu_check "$@"
