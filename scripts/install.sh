#!/usr/bin/env bash
# Installs streamrft and everything it needs into ./.venv (idempotent; ~3 minutes the first time).
# torch is pinned to 2.13.0 first so pip takes the local CPU wheel instead of a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==2.13.0"
fi
.venv/bin/pip install -q -e ".[dev]"
echo "streamrft installed in $(pwd)/.venv"
