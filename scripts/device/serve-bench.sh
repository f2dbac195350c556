#!/usr/bin/env bash
# On the lent GPU: hipscope serve beside llama-server (both on the GPU) on the same model, 1, 4
# and 16 concurrent streaming clients; prints the JSON lines and the Markdown table of
# scripts/serve-bench.sh.
#
#   scripts/device/serve-bench.sh [MODEL.gguf]
#
# Needs a prebuilt ./hipscope-bin (a release build of this tree) and a llama-server built there
# for the device (LLAMA_SERVER=path, default: llama-server on PATH). MODEL defaults to the
# default SmolLM2-135M-Instruct Q4_1 ($HIPSCOPE_TEST_MODEL).
set -euo pipefail
cd "$(dirname "$0")/../.."
hs=./hipscope-bin
[ -x "$hs" ] || { echo "no ./hipscope-bin: build it first (cargo build --release; cp target/release/hipscope hipscope-bin)" >&2; exit 2; }
ls_bin=${LLAMA_SERVER:-$(command -v llama-server || true)}
[ -x "$ls_bin" ] || { echo "no llama-server: set LLAMA_SERVER=path" >&2; exit 2; }
model=${1:-${HIPSCOPE_TEST_MODEL:?give a model file}}
"$hs" --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || rocm-smi --showproductname 2>/dev/null || true
exec scripts/serve-bench.sh "$hs" "$ls_bin" "$model" gpu
