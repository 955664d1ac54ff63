# One image for every streamrft role; docker-compose.yml picks the role with its command
# (`streamrft explore|score|train /config/run.yaml ...`). CPU torch by default: for GPU machines
# build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or a CUDA base image).
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap: the code_tests reward's sandbox. In a container it also needs a seccomp profile that
# allows user namespaces and mounts (docs/rewards.md); without one the reward raises, never runs code bare.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

# torch first and from its own index: as a plain dependency pip would pull the CUDA wheels (GBs)
RUN pip install "torch==2.13.0" --index-url "${TORCH_INDEX}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY streamrft ./streamrft
# the image fails to build, rather than to start, if the package or its entry point is broken
RUN pip install . && streamrft --help > /dev/null

RUN useradd --create-home --uid 1000 streamrft && mkdir -p /data && chown streamrft /data
USER streamrft
WORKDIR /data
CMD ["streamrft", "--help"]
