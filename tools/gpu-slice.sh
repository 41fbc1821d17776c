#!/usr/bin/env bash
# One slice of the paper campaign on an offline GPU node (see lab/gpu_slice.py):
#   bash tools/gpu-slice.sh MINUTES OUTDIR [--profile paper] [--pages 'moon_dpap_*'] [--tests gpu|all|none] ...
# Needs what `make gpu-bundle` wrote on a connected machine: .whl/ (wheels the node lacks) and
# .gpudata/ (the compressed datasets; one of them fits beside the repository). Uses the node's own torch; installs nothing from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if ! "$PYTHON" -c "import dp_accounting, opacus" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "error: dp-accounting or opacus is missing and .whl/ holds no wheels (run make gpu-bundle on a connected machine)" >&2
    exit 2
  fi
  SITE=${FEDLIB_SLICE_SITE:-/tmp/fedlib-site}
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m lab.gpu_slice "$@"
