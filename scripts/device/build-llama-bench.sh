#!/usr/bin/env bash
# Builds llama.cpp's llama-bench with CUDA (sm_90: H100, H200) on the device machine, from the
# archive scripts/device/pack-llama-src.sh made, into $DEST (default /tmp/llama); prints the
# binary's path last. About 5-6 minutes on 16 cores; a warm machine keeps /tmp, so a later call
# within its warm time finds the binary and returns at once.
#   LLAMA_SRC=.device-carry/llama-src.tar.xz scripts/device/build-llama-bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${LLAMA_SRC:-.device-carry/llama-src.tar.xz}
DEST=${DEST:-/tmp/llama}
bin=$DEST/build/bin/llama-bench
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$DEST"
tar -xJf "$SRC" -C "$DEST"
cmake -S "$DEST/llama.cpp" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    >"$DEST/cmake.log" 2>&1
cmake --build "$DEST/build" --target llama-bench -j "$(nproc)" >"$DEST/build.log" 2>&1
echo "$bin"
