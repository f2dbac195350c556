#!/usr/bin/env bash
# bench's decode bound against doctor's device copy (issue 33 item 8), on the device machine
# (CUDA or HIP; no Rust there: a prebuilt stripped release binary at ./hipscope-bin or
# $HIPSCOPE_BIN; python3).
#
# 1. `doctor --only bandwidth`: the device copy (read + write) and the read-only kernel's figure.
# 2. `bench` on a 7B-shape Q4_0 file (`synth llama-2-7b`), tg128 and tg128 at depth 2048, three
#    repetitions, table and JSON: the header's `read bandwidth:` line, the bound column and each
#    test's `% of bound`.
# 3. The same bench twice more: the read figure's spread between processes.
#
# Prints a short table and PASS/FAIL lines; exit 0 only when every check passes:
#   - bench's read bandwidth is at least 0.9x doctor's copy figure (a read-only stream is not
#     slower than a copy's read + write; the 2xH200 host printed 1.9 TB/s against 4.2),
#   - the three bench processes agree within 5%,
#   - every decode test is at most 100% of its bound.
# Files: $OUT (default /tmp): doctor.txt, bench.txt, bench-N.json, bound-check.log.
# Usage: scripts/device/bound-check.sh    Time: about 2-3 minutes on an H200 (the 7B file is
# written once, ~1 min); each step is cut by `timeout`, the whole inside 8 minutes.
set -u
cd "$(dirname "$0")/../.."
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
OUT_DIR=${OUT:-/tmp}
LOG=$OUT_DIR/bound-check.log
MODEL=${MODEL:-/tmp/llama-2-7b-q4_0.gguf}
BACKEND=${BACKEND:-auto}
if [ ! -x "$BIN" ]; then
    echo "bound-check.sh: no hipscope binary at $BIN (set HIPSCOPE_BIN)" >&2
    exit 2
fi
command -v python3 >/dev/null || { echo "bound-check.sh: needs python3" >&2; exit 2; }
BIN=$(realpath "$BIN")
mkdir -p "$OUT_DIR"
: >"$LOG"
deadline=$(($(date +%s) + 470))
run() { # run LIMIT_S CMD...: logged, cut at the limit or at what is left of 8 minutes
    local lim=$1; shift
    local l=$((deadline - $(date +%s)))
    [ "$lim" -gt "$l" ] && lim=$l
    [ "$lim" -lt 5 ] && { echo "out of time before: $*" >>"$LOG"; return 124; }
    echo "+ $*" >>"$LOG"
    timeout --kill-after=10 "$lim" "$@"
}

run 90 "$BIN" doctor --backend "$BACKEND" --only bandwidth >"$OUT_DIR/doctor.txt" 2>>"$LOG"
if [ ! -s "$MODEL" ]; then
    run 240 "$BIN" synth llama-2-7b --quant Q4_0 -o "$MODEL" >>"$LOG" 2>&1 || {
        echo "FAIL: could not write the 7B synthetic model (see $LOG)"; exit 1; }
fi
bench=("$BIN" bench -m "$MODEL" --backend "$BACKEND" -p 0 -n 128 -d 0,2048 -r 3)
run 150 "${bench[@]}" >"$OUT_DIR/bench.txt" 2>>"$LOG"
for i in 1 2 3; do
    run 120 "${bench[@]}" -d 0 -r 1 --json >"$OUT_DIR/bench-$i.json" 2>>"$LOG"
done

OUT_DIR="$OUT_DIR" python3 - <<'EOF'
import json, os, re, sys
d = os.environ["OUT_DIR"]
doctor = open(f"{d}/doctor.txt", errors="replace").read()
bench = open(f"{d}/bench.txt", errors="replace").read()
m = re.search(r"device copy (\d+) GB/s", doctor)
copy = float(m.group(1)) if m else float("nan")
m = re.search(r"read (\d+) GB/s \(read-only kernel", doctor)
doctor_read = float(m.group(1)) if m else float("nan")
m = re.search(r"^read bandwidth: ([\d.]+) GB/s \((.*)\)$", bench, re.M)
header = float(m.group(1)) if m else float("nan")
how = m.group(2) if m else "no 'read bandwidth:' line in bench's header"
runs = []
for i in (1, 2, 3):
    try:
        rows = json.load(open(f"{d}/bench-{i}.json"))
        runs.append(rows)
    except Exception as e:
        print(f"bench-{i}.json: {e}")
jbw = [r[0]["bound"]["bandwidth"] / 1e9 for r in runs if r and r[0].get("bound")]
print(f"{'figure':<44} {'GB/s':>9}")
print(f"{'doctor: device copy (read + write)':<44} {copy:>9.0f}")
print(f"{'doctor: read-only kernel':<44} {doctor_read:>9.0f}")
print(f"{'bench header: read bandwidth':<44} {header:>9.1f}   ({how})")
for i, b in enumerate(jbw, 1):
    print(f"{'bench JSON run ' + str(i) + ': bound.bandwidth':<44} {b:>9.1f}")
print()
print(f"{'test':<16} {'t/s':>10} {'bound t/s':>10} {'% of bound':>10}")
pct_ok = True
tests = []
for line in bench.splitlines():
    if "tg128" in line and "|" in line:
        tests.append(line.strip())
for rows in runs:
    for r in rows:
        if r.get("bound_ts"):
            p = 100 * r["avg_ts"] / r["bound_ts"]
            pct_ok &= p <= 100.0
            print(f"{r['test']:<16} {r['avg_ts']:>10.1f} {r['bound_ts']:>10.1f} {p:>9.1f}%")
print()
print("bench table rows:")
for t in tests:
    print("  " + t)
ok = True
def check(name, cond, detail):
    global ok
    ok &= bool(cond)
    print(f"{'PASS' if cond else 'FAIL'}  {name}: {detail}")
check("read >= 0.9x copy", header >= 0.9 * copy, f"{header:.0f} vs {copy:.0f} GB/s")
spread = (max(jbw) - min(jbw)) / max(jbw) * 100 if len(jbw) == 3 else float("nan")
check("3 processes within 5%", spread <= 5.0, f"spread {spread:.1f}%")
check("every decode test <= 100% of its bound", pct_ok and runs, "see above")
sys.exit(0 if ok else 1)
EOF
