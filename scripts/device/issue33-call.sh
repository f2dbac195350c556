#!/usr/bin/env bash
# Issue 33 in one device call (about 9-10 minutes on an H100, inside the 10 a command allows):
# 1. the table's files written in the background (issue33-table.sh SYNTH_ONLY=1) while the GPU
#    runs `selftest --compute` on the Qwen 3, Gemma 3 and SmolLM2 shapes (SELFTEST_SHAPES; Q4_0, Q4_K; graphs on, and
#    launch overlap, HIPSCOPE_PDL=1, which is what it checks) against the CPU backend (SELFTEST_S, 100 s);
# 2. hipscope alone on gemma3-1b and qwen3-0.6b (tg128 at depth 0 and 4096) with launch overlap
#    off (HIPSCOPE_PDL=0), with each of $VARIANTS (NAME=DIR kernel sources, HIPSCOPE_KERNELS), and
#    as it ships: what each gains, side by side;
# 3. issue33-table.sh: every figure of the issue beside llama.cpp (LLAMA_BENCH, prebuilt and
#    carried: building it here would not leave the time). Its raw rows reach $OUT as they come.
# Files under $OUT: issue33-table.md, issue33-raw.jsonl, issue33-call.log, selftest.log.
#   HIPSCOPE_BIN=... LLAMA_BENCH=... [VARIANTS="att=DIR"] scripts/device/issue33-call.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${HIPSCOPE_BIN:-./hipscope-bin}")
export HIPSCOPE_BIN=$BIN
OUT_DIR=${OUT:-/tmp}
export WORK=${WORK:-/tmp/i33}
LOG=$OUT_DIR/issue33-call.log
mkdir -p "$OUT_DIR" "$WORK"
: >"$LOG"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
# TABLE=0 (a short call): only the two small files, the selftest and step 2, with llama.cpp's
# rows for those two files beside.
if [ "${TABLE:-1}" = 1 ]; then
    SYNTH_ONLY=1 OUT=$WORK scripts/device/issue33-table.sh >"$WORK/synth.out" 2>&1 &
else
    for x in "g1-q4_0 gemma3-1b" "q06-q4_0 qwen3-0.6b"; do
        set -- $x
        [ -s "$WORK/$1.gguf" ] || "$BIN" synth "$2" --quant Q4_0 -o "$WORK/$1.gguf" >"$WORK/$1.synth.log" 2>&1 &
    done
fi
synth=$!
HIPSCOPE_PDL=1 timeout "${SELFTEST_S:-100}" "$BIN" selftest --compute \
    --shapes "${SELFTEST_SHAPES:-tiny-qwen3,tiny-gemma3,smollm2-135m}" \
    --quants Q4_0,Q4_K >"$OUT_DIR/selftest.log" 2>&1
echo "selftest --compute: exit $? $(el)" | tee -a "$LOG"
grep -iE "^device:|verdict|fail|worst" "$OUT_DIR/selftest.log" | tail -6 | tee -a "$LOG"
# hs TAG FILE ENV...: hipscope alone, tg128 at depth 0 and 4096, one line per test.
hs() {
    local tag=$1 f=$2
    shift 2
    env "$@" timeout 120 "$BIN" bench -m "$WORK/$f.gguf" -p 0 -n 128 -d 0,4096 -r 3 --json \
        2>>"$LOG" | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print("%-18s %-9s %-14s %9.1f ± %5.1f  overlap: %s" % (sys.argv[1], sys.argv[2], r["test"],
          r["avg_ts"], r["stddev_ts"], r.get("launch_overlap")))' "$tag" "$f" | tee -a "$LOG"
}
# The two small files are written first of all (seconds): their rows need not wait for the rest.
for f in g1-q4_0 q06-q4_0; do
    while [ ! -s "$WORK/$f.gguf" ] || pgrep -f "synth .*$f.gguf" >/dev/null; do sleep 1; done
done
echo "== hipscope alone: overlap off, kernel variants, main $(el)" | tee -a "$LOG"
for f in g1-q4_0 q06-q4_0; do
    hs "overlap off" "$f" HIPSCOPE_PDL=0
    for v in ${VARIANTS:-}; do
        hs "${v%%=*}, overlap on" "$f" HIPSCOPE_PDL=1 HIPSCOPE_KERNELS="$(realpath "${v#*=}")"
    done
    hs "overlap on" "$f" HIPSCOPE_PDL=1
    if [ "${TABLE:-1}" != 1 ] && [ -x "${LLAMA_BENCH:-}" ]; then
        timeout 120 "$LLAMA_BENCH" -m "$WORK/$f.gguf" -p 0 -n 128 -d 0,4096 -r 3 -ngl 99 2>>"$LOG" |
            grep -E "tg128" | sed "s/^/llama.cpp $f /" | tee -a "$LOG"
    fi
done
[ "${TABLE:-1}" = 1 ] || { echo "done (TABLE=0) $(el)" | tee -a "$LOG"; exit 0; }
wait "$synth"
echo "files: $(tail -1 "$WORK/synth.out") $(el)" | tee -a "$LOG"
scripts/device/issue33-table.sh 2>&1 | tee -a "$LOG"
echo "done $(el)" | tee -a "$LOG"
