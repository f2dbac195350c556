#!/usr/bin/env bash
# Per-kernel GPU time of one decode step, hipscope beside llama.cpp, under Nsight Compute (each
# kernel timed alone: ncu serializes them; hipscope's graph nodes are profiled one by one).
# Runs on the device machine with HIPSCOPE_BIN, LLAMA_BENCH and the files of issue33-call.sh in
# $WORK. Each row: both engines on FILE with `-p 0 -n 3 -r 1 [-d D]`; the last complete step is
# found as the shortest period of kernel names that repeats at the end of the run.
# Output: $OUT/ncu-step.log (a table per engine and row), raw CSVs in $WORK.
#   ROWS="g1-q4_k 0
#   q30-q4_0 0" scripts/device/ncu-step.sh
. "$(dirname "$0")/env.sh"
LOG=$OUT_DIR/ncu-step.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu-step.sh: no ncu on this machine" | tee -a "$LOG"; exit 2; }
summ() {
    python3 - "$1" "$2" <<'PY'
import csv, sys, collections
path, tag = sys.argv[1], sys.argv[2]
rows = []
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    ns = v * {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
    name = r["Kernel Name"].split("(")[0].split("<")[0].strip()
    rows.append((name, ns, r.get("Grid Size", ""), r.get("Block Size", "")))
names = [r[0] for r in rows]
period = None
for p in range(20, len(names) // 2 + 1):
    if names[-p:] == names[-2 * p:-p]:
        period = p
        break
if period is None:
    print(f"{tag}: no repeating step among {len(names)} kernels")
    sys.exit()
step = rows[-period:]
tot = collections.OrderedDict()
for name, ns, g, b in step:
    t = tot.setdefault(name, [0, 0.0, g, b])
    t[0] += 1
    t[1] += ns
print(f"{tag}: step of {period} kernels, {sum(r[1] for r in step) / 1e3:.1f} us of kernel time")
for name, (n, ns, g, b) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"  {name[:44]:44s} {n:5d} {ns / 1e3:9.1f} us {ns / n / 1e3:7.2f} us/launch grid {g} block {b}")
PY
}
while read -r f d; do
    [ -s "$WORK/$f.gguf" ] || continue
    for eng in hs ll; do
        csvf=$WORK/ncu-$f-d$d-$eng.csv
        if [ $eng = hs ]; then
            cmd=("$BIN" bench -m "$WORK/$f.gguf" -p 0 -n 3 -r 1 -d "$d")
        else
            [ -x "$LB" ] || continue
            cmd=("$LB" -m "$WORK/$f.gguf" -p 0 -n 3 -r 1 -d "$d" -ngl 99)
        fi
        timeout "${NCU_S:-150}" "$NCU" --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --csv "${cmd[@]}" >"$csvf" 2>"$csvf.err"
        echo "== $eng $f d$d (exit $?)" >>"$LOG"
        summ "$csvf" "$eng $f d$d" 2>&1 | head -"${TOP:-24}" | tee -a "$LOG"
    done
done <<<"${ROWS:-g1-q4_k 0
q30-q4_0 0}"
