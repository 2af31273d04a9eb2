#!/usr/bin/env bash
# Install llama.cpp's server (through llama-cpp-python) into its own virtualenv, so that
# bench/peers.py can serve the same model with it. Separate from .venv because its
# dependencies (numpy, pydantic, fastapi, ...) need not agree with ours.
#
#     bash bench/setup_llama_cpp.sh            # -> .venv-peers/llama-cpp
#     LLAMA_CPP_VERSION=0.3.16 bash bench/setup_llama_cpp.sh
#
# It builds llama.cpp from source (several minutes on 2 cores). GGML_NATIVE=OFF: a
# build tuned to this CPU (-march=native) takes the AMX code path, which crashes here;
# the portable build still picks AVX2/AVX-512 kernels at run time.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LLAMA_CPP_VENV:-$repo_root/.venv-peers/llama-cpp}"
python="${PYTHON:-python3.11}"
spec="llama-cpp-python[server]"
if [[ -n "${LLAMA_CPP_VERSION:-}" ]]; then
    spec="llama-cpp-python[server]==${LLAMA_CPP_VERSION}"
fi

if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --upgrade pip
start=$(date +%s)
CMAKE_ARGS="-DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$venv/bin/python" -m pip install --no-cache-dir "$spec"
end=$(date +%s)
"$venv/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
echo "built and installed in $((end - start)) s into $venv"
