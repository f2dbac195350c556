#!/usr/bin/env bash
# The kernels of issues 30.3 / 38 on the lent NVIDIA GPU (CUDA, no Rust toolchain): every compile
# unit built for the device's sm_XX from an empty cache, the GPU forward pass checked op by op
# against the CPU (`selftest --compute`) on dense and mixture-of-experts shapes in every weight
# type, and a quick bench so a speed regression shows. Prints a short table; exit 0 when every
# step passed. Budget: 8 minutes on an H200 (each step has its own timeout).
#
#   HIPSCOPE_BIN=./hipscope-bin scripts/device/kernels-check.sh   (default: ./hipscope-bin)
#   OUT=DIR keeps the logs there (default: $OUT or a temp dir).
set -u
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
LOGS=${OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
[ -x "$BIN" ] || { echo "no hipscope binary at $BIN (set HIPSCOPE_BIN)"; exit 2; }
# A cache of its own: the first step compiles everything afresh.
export HIPSCOPE_HOME=$(mktemp -d)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
ARCH=sm_${cap:-90}
ALL=F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ4_NL,IQ4_XS,MXFP4
rows=()
fail=0

# step NAME SECONDS CMD...: runs CMD with a timeout, its output in $LOGS/NAME.log.
step() {
    local name=$1 secs=$2
    shift 2
    local t0=$EPOCHREALTIME
    timeout "$secs" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$rc $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
}

# A selftest's verdict: "PASS n/n worst 0.41x" or "FAIL k of n ...".
verdict() {
    local log=$1 rc=$2
    local worst=$(grep -E ' (PASS|FAIL)' "$log" | grep -oE '[0-9.]+×' | tr -d '×' | sort -g | tail -1)
    local total=$(grep -cE ' (PASS|FAIL)' "$log")
    local bad=$(grep -cE ' FAIL|error' "$log")
    if [ "$rc" = 0 ] && [ "$bad" = 0 ]; then
        echo "PASS $total/$total cases, worst op ${worst:-?}x of its bound"
    else
        echo "FAIL $bad of $total (rc $rc), worst op ${worst:-?}x; see $log"
    fi
}

r=($(step compile 240 "$BIN" kernels --compile --backend cuda --arch "$ARCH"))
n=$(grep -oE '[0-9]+ of [0-9]+ compiled' "$LOGS/compile.log")
if [ "${r[0]}" = 0 ]; then v="PASS $n"; else v="FAIL (rc ${r[0]}) $n; see $LOGS/compile.log"; fail=1; fi
rows+=("every unit for $ARCH, empty cache|${r[1]}|$v")

r=($(step dense 150 "$BIN" selftest --compute --backend cuda --shapes tiny,tiny-qwen2 --quants "$ALL"))
rows+=("dense, every type (tiny, tiny-qwen2)|${r[1]}|$(verdict "$LOGS/dense.log" "${r[0]}")")

r=($(step smollm2 90 "$BIN" selftest --compute --backend cuda --shapes smollm2-135m --quants Q4_0,Q4_1,Q8_0))
rows+=("dense, real shape (smollm2-135m)|${r[1]}|$(verdict "$LOGS/smollm2.log" "${r[0]}")")

r=($(step moe 200 "$BIN" selftest --compute --backend cuda --shapes mixtral-tiny-2l,tiny-qwen3moe,tiny-gpt-oss --quants "$ALL"))
rows+=("experts, every type (mixtral, qwen3moe, gpt-oss)|${r[1]}|$(verdict "$LOGS/moe.log" "${r[0]}")")

for m in qwen3-0.6b llama-2-7b; do
    r=($(step "bench-$m" 120 "$BIN" bench --backend cuda --synthetic "$m" --quant Q4_0 -p 512 -n 128 -r 3))
    # llama-bench's table: the t/s column of pp512 and tg128.
    pp=$(grep -E '\| +pp512 \|' "$LOGS/bench-$m.log" | awk -F'|' '{ gsub(/^ +| +$/, "", $8); print $8 }' | head -1)
    tg=$(grep -E '\| +tg128 \|' "$LOGS/bench-$m.log" | awk -F'|' '{ gsub(/^ +| +$/, "", $8); print $8 }' | head -1)
    if [ "${r[0]}" = 0 ]; then v="pp512 ${pp:-?} t/s, tg128 ${tg:-?} t/s"; else v="FAIL (rc ${r[0]}); see $LOGS/bench-$m.log"; fail=1; fi
    rows+=("bench $m Q4_0|${r[1]}|$v")
done

echo
echo "hipscope kernels check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) [$ARCH], $("$BIN" --version 2>/dev/null)"
printf '%-52s %8s  %s\n' "step" "secs" "result"
for row in "${rows[@]}"; do
    IFS='|' read -r a b c <<<"$row"
    [[ $c == FAIL* ]] && fail=1
    printf '%-52s %8s  %s\n' "$a" "$b" "$c"
done
echo "logs: $LOGS"
rm -rf "$HIPSCOPE_HOME"
exit $fail
