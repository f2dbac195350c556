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
scripts/serve-bench.sh "$hs" "$ls_bin" "$model" gpu
# Whether batched greedy answers equal the answers alone on the GPU (the CPU holds them equal;
# the GPU's matvec and GEMM paths are not held equal row for row yet).
port=$((40000 + RANDOM % 10000))
"$hs" serve --headless -m "$model" --port "$port" --parallel 4 -c 4096 2>/tmp/serve-exact.log &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
python3 scripts/serve-exact.py --url "http://127.0.0.1:$port" --clients 4 --max-tokens 48 || true
