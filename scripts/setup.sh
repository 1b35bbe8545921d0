#!/usr/bin/env bash
# Set up ./.venv with autotune (and, with --test, its test extra).
# Without a CUDA driver, the CPU build of torch is installed first: a bare `torch` requirement
# would otherwise pull several GB of CUDA packages that such a machine cannot use.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
py=.venv/bin/python
pip_quiet() {  # pip's output only when it fails
  local log; log=$(mktemp)
  if ! "$py" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}

if ! "$py" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_quiet torch
  else
    # A local CPU wheel where the machine provides one, else PyTorch's CPU index.
    pip_quiet "torch==2.13.0+cpu" 2>/dev/null || pip_quiet torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip_quiet -e ".$extra"
"$py" -c "import torch, autotune; print(f'autotune {autotune.__version__} ready: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}')"
