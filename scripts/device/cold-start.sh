#!/usr/bin/env bash
# A first start on the lent GPU with an empty kernel cache (issue 38): how long `hipscope doctor`
# takes, and how long from start to a first answer's first token (`generate -n 1` runs what a
# chat's first answer waits for: device open, the model's kernels compiled, weights uploaded, the
# prompt, one token). Targets: cold doctor <= 10 s, cold first answer <= 15 s. The model is the
# default model's shape and type (SmolLM2-135M, Q4_1), written synthetically (the device has no
# network) and configured as the model, so that doctor's `kernels` check builds what a first chat
# needs. Warm runs (the cache filled) beside them. Prints a short table; exit 0 when both targets
# are met.
#
#   HIPSCOPE_BIN=./hipscope-bin scripts/device/cold-start.sh   (default: ./hipscope-bin)
set -u
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
[ -x "$BIN" ] || { echo "no hipscope binary at $BIN (set HIPSCOPE_BIN)"; exit 2; }
BACKEND=${BACKEND:-cuda}
WORK=$(mktemp -d)
export HIPSCOPE_HOME=$WORK/home
export HIPSCOPE_CONFIG=$WORK/config.toml
MODEL=$WORK/smollm2-135m-q4_1.gguf
"$BIN" synth smollm2-135m --quant Q4_1 -o "$MODEL" >"$WORK/synth.log" 2>&1 || {
    echo "could not write the model: $(tail -3 "$WORK/synth.log")"
    exit 2
}
printf 'model = "%s"\n' "$MODEL" >"$HIPSCOPE_CONFIG"
KCACHE=$HIPSCOPE_HOME/cache/kernels

# timed NAME CMD...: runs CMD, its output in $WORK/NAME.log; prints "rc secs".
timed() {
    local name=$1
    shift
    local t0=$EPOCHREALTIME
    timeout 300 "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    echo "$rc $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
}

rows=()
ok=0
row() { # name target rc secs note
    local verdict
    if [ "$3" != 0 ]; then
        verdict="FAIL (exit $3)"
        ok=1
    elif [ -n "$2" ] && awk -v s="$4" -v t="$2" 'BEGIN { exit !(s > t) }'; then
        verdict="OVER the ${2} s target"
        ok=1
    else
        verdict="ok${2:+ (target ${2} s)}"
    fi
    rows+=("$1|$4|$verdict|$5")
}

rm -rf "$KCACHE"
r=($(timed doctor-cold "$BIN" doctor --backend "$BACKEND"))
k=$(grep -m1 -E 'kernels' "$WORK/doctor-cold.log" | sed 's/^ *//' | cut -c1-110)
row "doctor, empty kernel cache" 10 "${r[0]}" "${r[1]}" "$k"
r=($(timed doctor-warm "$BIN" doctor --backend "$BACKEND"))
row "doctor, warm" "" "${r[0]}" "${r[1]}" ""

rm -rf "$KCACHE"
r=($(timed answer-cold "$BIN" generate --backend "$BACKEND" -m "$MODEL" -p "Hello" -n 1))
c=$(grep -m1 -E 'compiled GPU kernels' "$WORK/answer-cold.log" | cut -c1-110)
row "first answer (generate -n 1), empty cache" 15 "${r[0]}" "${r[1]}" "$c"
r=($(timed answer-warm "$BIN" generate --backend "$BACKEND" -m "$MODEL" -p "Hello" -n 1))
row "first answer, warm" "" "${r[0]}" "${r[1]}" ""

echo "cold start on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ($(nproc) cores), $("$BIN" --version 2>/dev/null)"
printf '%-44s %7s  %-24s %s\n' "step" "secs" "verdict" "detail"
for x in "${rows[@]}"; do
    IFS='|' read -r a b c d <<<"$x"
    printf '%-44s %7s  %-24s %s\n' "$a" "$b" "$c" "$d"
done
echo "logs: $WORK"
exit $ok
