#!/usr/bin/env bash
# Where decode and prompt time goes, op by op, for the rows of issue 33 still below llama.cpp:
# `hipscope bench --profile` on each, and llama.cpp's kernels on the same file under Nsight
# Systems (`nsys`, when the device has it: its cuda_gpu_kern_sum report, top kernels by time).
# Runs on the device machine with HIPSCOPE_BIN and LLAMA_BENCH set (as issue33-call.sh).
# Files under $OUT: profile-call.log (everything), one NAME.hs.txt / NAME.ll.txt per row.
#   HIPSCOPE_BIN=... LLAMA_BENCH=... scripts/device/profile-call.sh
. "$(dirname "$0")/env.sh"
LOG=$OUT_DIR/profile-call.log
mkdir -p "$WORK" "$OUT_DIR"
: >"$LOG"
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}" | tee -a "$LOG"
# name synth-shape quant
FILES="${FILES:-g1-q4_k gemma3-1b Q4_K
g1-q4_0 gemma3-1b Q4_0
q30-q4_0 qwen3-30b-a3b Q4_0
smol-q4_0 smollm2-135m Q4_0
oss-q8_0 gpt-oss-20b Q8_0}"
while read -r name shape quant; do
    [ -s "$WORK/$name.gguf" ] || timeout 300 "$BIN" synth "$shape" --quant "$quant" -o "$WORK/$name.gguf" \
        >"$WORK/$name.synth.log" 2>&1 &
done <<<"$FILES"
wait
# ROWS: tag file args...
ROWS="${ROWS:-g1k-tg g1-q4_k -p 0 -n 64
g1-d4096 g1-q4_0 -p 0 -n 64 -d 4096
smol-d4096 smol-q4_0 -p 0 -n 64 -d 4096
q30-tg q30-q4_0 -p 0 -n 64
q30-pp q30-q4_0 -p 512 -n 0
oss-pp oss-q8_0 -p 512 -n 0}"
while read -r tag f args; do
    echo "== $tag: $f $args" | tee -a "$LOG"
    HIPSCOPE_PDL=1 timeout 120 "$BIN" bench -m "$WORK/$f.gguf" $args -r 2 --profile \
        >"$OUT_DIR/$tag.hs.txt" 2>&1
    head -c 6000 "$OUT_DIR/$tag.hs.txt" >>"$LOG"
    if [ -n "$NSYS" ] && [ -x "$LB" ]; then
        rm -f "$WORK/$tag.nsys-rep" "$WORK/$tag.sqlite"
        timeout 150 "$NSYS" profile -t cuda -o "$WORK/$tag" "$LB" -m "$WORK/$f.gguf" $args -r 2 -ngl 99 \
            >"$WORK/$tag.nsys.out" 2>&1
        timeout 90 "$NSYS" stats -q --report cuda_gpu_kern_sum --format csv "$WORK/$tag.nsys-rep" 2>&1 |
            python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if r]
hdr = next((i for i, r in enumerate(rows) if "Time (%)" in r[0]), None)
if hdr is None:
    print("".join(",".join(r) + "\n" for r in rows[:20])); sys.exit()
h = rows[hdr]
ix = {k: h.index(k) for k in ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Name")}
for r in rows[hdr + 1:hdr + 26]:
    print("%6s%% %12s ns %7s x %10s ns  %s" % (r[ix["Time (%)"]], r[ix["Total Time (ns)"]],
          r[ix["Instances"]], r[ix["Avg (ns)"]], r[ix["Name"]][:110]))' >"$OUT_DIR/$tag.ll.txt"
        echo "-- llama.cpp kernels ($tag)" >>"$LOG"
        cat "$OUT_DIR/$tag.ll.txt" >>"$LOG"
    fi
done <<<"$ROWS"
echo done | tee -a "$LOG"
