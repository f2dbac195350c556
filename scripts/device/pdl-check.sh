#!/usr/bin/env bash
# Launch overlap (issue 33 item 1: CUDA's programmatic dependent launch, `HIPSCOPE_PDL`) on the
# device machine, in one call: is it right, what does it gain, and where does decode then stand
# beside llama.cpp. No Rust there: a prebuilt stripped hipscope at $HIPSCOPE_BIN (default
# ./hipscope-bin); llama-bench built in the background meanwhile (build-llama-bench.sh, from
# .device-carry/llama-src.tar.xz) unless $LLAMA_BENCH names one (LLAMA_BENCH=none: steps 1-2 only).
#
# 1. Right: `selftest --compute` (overlap on: HIPSCOPE_PDL=1) on the Qwen 3 and Gemma 3 shapes and
#    SmolLM2's, Q4_0 and Q4_K, end to end (graph replay) against the CPU backend; and
#    `generate` greedy on each bench file with overlap on and off: the same tokens.
# 2. Gain: `bench -p 0 -n 128 -d 0,4096 -r 3` on qwen3-0.6b and gemma3-1b (synth, Q4_0), with
#    HIPSCOPE_PDL=0 and =1, alternating, while llama.cpp builds beside (the same load for both).
# 3. Beside llama.cpp, once it is built: llama-bench and hipscope (overlap on) on the same files,
#    the same arguments, alternating.
# VARIANTS="NAME=DIR ..." adds kernel sources to compare (HIPSCOPE_KERNELS=DIR, overlap on): each
# gets the selftest (Q4_0) and a column in steps 2 and 3.
# Prints a table; files under $OUT: pdl-check.md, pdl-raw.jsonl, pdl-check.log.
# Time: about 8-9 minutes on an H100 (the llama.cpp build ~5.5 of them, beside steps 1-2).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${HIPSCOPE_BIN:-./hipscope-bin}")
OUT_DIR=${OUT:-/tmp}
WORK=${WORK:-/tmp/i33}
LOG=$OUT_DIR/pdl-check.log
RAW=$OUT_DIR/pdl-raw.jsonl
mkdir -p "$OUT_DIR" "$WORK"
: >"$LOG"
: >"$RAW"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
[ -x "$BIN" ] || { echo "pdl-check.sh: no hipscope binary at $BIN" >&2; exit 2; }
LB=${LLAMA_BENCH:-}
if [ -z "$LB" ]; then
    (nice -n 10 scripts/device/build-llama-bench.sh >"$WORK/llama-build.out" 2>&1) &
    build_pid=$!
fi

for f in "q06 qwen3-0.6b" "g1 gemma3-1b"; do
    set -- $f
    [ -s "$WORK/$1-q4_0.gguf" ] ||
        "$BIN" synth "$2" --quant Q4_0 -o "$WORK/$1-q4_0.gguf" >>"$LOG" 2>&1 &
done
wait_files() { for f in q06 g1; do while [ ! -s "$WORK/$f-q4_0.gguf" ] || pgrep -f "synth.*$f-q4_0" >/dev/null; do sleep 1; done; done; }

echo "== 1. selftest --compute (overlap on) $(el)" | tee -a "$LOG"
HIPSCOPE_PDL=1 timeout 200 "$BIN" selftest --compute --shapes tiny-qwen3,tiny-gemma3,smollm2-135m \
    --quants Q4_0,Q4_K >"$WORK/selftest.log" 2>&1
echo "selftest exit $? $(el)" | tee -a "$LOG"
grep -iE "^device:|verdict|pass|fail|worst" "$WORK/selftest.log" | tail -8 | tee -a "$LOG"
for v in ${VARIANTS:-}; do
    HIPSCOPE_PDL=1 HIPSCOPE_KERNELS=$(realpath "${v#*=}") timeout 120 "$BIN" selftest --compute \
        --shapes tiny-qwen3,tiny-gemma3,smollm2-135m --quants Q4_0 >"$WORK/selftest-${v%%=*}.log" 2>&1
    echo "selftest ${v%%=*}: exit $? $(el)" | tee -a "$LOG"
    grep -iE "verdict|fail|worst" "$WORK/selftest-${v%%=*}.log" | tail -6 | tee -a "$LOG"
done
wait_files
same=ok
for f in q06 g1; do
    for pdl in 0 1; do
        HIPSCOPE_PDL=$pdl timeout 120 "$BIN" generate -m "$WORK/$f-q4_0.gguf" -n 64 --temp 0 \
            -p "The history of the printing press" >"$WORK/$f-gen-$pdl.txt" 2>>"$LOG"
    done
    if cmp -s "$WORK/$f-gen-0.txt" "$WORK/$f-gen-1.txt" && [ -s "$WORK/$f-gen-1.txt" ]; then
        echo "generate $f: overlap on and off give the same $(wc -c <"$WORK/$f-gen-1.txt") bytes" | tee -a "$LOG"
    else
        same=DIFFER
        echo "generate $f: overlap on and off DIFFER (or are empty)" | tee -a "$LOG"
        diff <(head -c 400 "$WORK/$f-gen-0.txt") <(head -c 400 "$WORK/$f-gen-1.txt") | head -8 | tee -a "$LOG"
    fi
done

# hs FILE TAG ENV...: one hipscope bench, rows appended to $RAW as engine TAG.
hs() {
    local f=$1 tag=$2
    shift 2
    env "$@" timeout 200 "$BIN" bench -m "$WORK/$f-q4_0.gguf" -p 0 -n 128 -d 0,4096 -r 3 --json \
        2>>"$LOG" | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print(json.dumps({"file": sys.argv[1], "engine": sys.argv[2], "test": r["test"],
                      "depth": r.get("n_depth", 0), "avg_ts": r["avg_ts"], "sd": r["stddev_ts"],
                      "overlap": r.get("launch_overlap"), "device": r["device"]}))' "$f" "$tag" >>"$RAW"
}
# Step 2's rows are marked when llama.cpp was building beside them.
SUF=${build_pid:+ (build beside)}
echo "== 2. overlap off and on$SUF $(el)" | tee -a "$LOG"
for f in q06 g1; do
    hs "$f" "hipscope, PDL=0$SUF" HIPSCOPE_PDL=0
    hs "$f" "hipscope, PDL=1$SUF" HIPSCOPE_PDL=1
    for v in ${VARIANTS:-}; do
        hs "$f" "${v%%=*}, PDL=1$SUF" HIPSCOPE_PDL=1 HIPSCOPE_KERNELS="$(realpath "${v#*=}")"
    done
done
echo "step 2 done $(el)" | tee -a "$LOG"

if [ "$LB" = none ]; then
    LB=
elif [ -z "$LB" ]; then
    wait "$build_pid"
    LB=$(tail -1 "$WORK/llama-build.out")
fi
echo "llama-bench: $LB $(el)" | tee -a "$LOG"
if [ -x "$LB" ]; then
    echo "== 3. beside llama.cpp $(el)" | tee -a "$LOG"
    for f in q06 g1; do
        for round in 1 2; do
            # Inside the device's 10 minutes a command, with time left for the table.
            [ $(($(date +%s) - t0)) -gt "${DEADLINE:-520}" ] && { echo "out of time: $f round $round" | tee -a "$LOG"; break; }
            timeout 200 "$LB" -m "$WORK/$f-q4_0.gguf" -p 0 -n 128 -d 0,4096 -r 3 -ngl 99 -o json \
                2>>"$LOG" | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    t = "tg%d" % r["n_gen"] + (" @ d%d" % r["n_depth"] if r.get("n_depth") else "")
    print(json.dumps({"file": sys.argv[1], "engine": "llama.cpp", "test": t,
                      "depth": r.get("n_depth", 0), "avg_ts": r["avg_ts"], "sd": r["stddev_ts"],
                      "overlap": None, "device": r.get("gpu_info", "")}))' "$f" >>"$RAW"
            hs "$f" "hipscope, PDL=1" HIPSCOPE_PDL=1
            hs "$f" "hipscope, PDL=0" HIPSCOPE_PDL=0
            for v in ${VARIANTS:-}; do
                hs "$f" "${v%%=*}, PDL=1" HIPSCOPE_PDL=1 HIPSCOPE_KERNELS="$(realpath "${v#*=}")"
            done
        done
    done
else
    [ -n "$LB" ] || [ -z "${build_pid:-}" ] || echo "llama-bench did not build: $(tail -5 "$WORK/llama-build.out" /tmp/llama/build.log 2>/dev/null)" | tee -a "$LOG"
fi

python3 - "$RAW" "$OUT_DIR/pdl-check.md" "$same" ${VARIANTS:-} <<'PY' | tee -a "$LOG"
import json, sys
from collections import OrderedDict, defaultdict
raw, md, same = sys.argv[1], sys.argv[2], sys.argv[3]
acc = OrderedDict()
dev = ""
for line in open(raw):
    r = json.loads(line)
    d = r["depth"]
    key = (r["file"], d)
    acc.setdefault(key, defaultdict(list))[r["engine"]].append(r["avg_ts"])
    if r["engine"].startswith("hipscope"):
        dev = r["device"]
names = {"q06": "qwen3-0.6b Q4_0", "g1": "gemma3-1b Q4_0"}
variants = [v.split("=")[0] for v in sys.argv[4:]]
engines = ["llama.cpp", "hipscope, PDL=1", "hipscope, PDL=0"] + [f"{v}, PDL=1" for v in variants] + \
    ["hipscope, PDL=1 (build beside)", "hipscope, PDL=0 (build beside)"] + \
    [f"{v}, PDL=1 (build beside)" for v in variants]
out = [f"device: {dev}", f"generate, overlap on vs off: {same}", "",
       "tg128 tokens/s, mean of the runs (each -r 3)", "",
       "| model | depth | " + " | ".join(engines) + " | PDL=1 / llama.cpp | PDL=1 / PDL=0 |",
       "|---|---:|" + "---:|" * (len(engines) + 2)]
for (f, d), e in acc.items():
    m = {k: sum(v) / len(v) for k, v in e.items()}
    cells = [f"{m[k]:.1f} (n={len(e[k])})" if k in m else "—" for k in engines]
    r1 = f"{m['hipscope, PDL=1'] / m['llama.cpp']:.3f}" if "llama.cpp" in m and "hipscope, PDL=1" in m else "—"
    a, b = ("hipscope, PDL=1", "hipscope, PDL=0") if "hipscope, PDL=0" in m else \
        ("hipscope, PDL=1 (build beside)", "hipscope, PDL=0 (build beside)")
    r2 = f"{m[a] / m[b]:.3f}" if a in m and b in m else "—"
    out.append(f"| {names.get(f, f)} | {d} | " + " | ".join(cells) + f" | {r1} | {r2} |")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
echo "done $(el)"
