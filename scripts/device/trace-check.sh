#!/usr/bin/env bash
# The tracer on a real GPU (issue 34): a 7B-shape decode trace checked against ncu, and what
# tracing costs. Runs on the device machine (CUDA; no Rust there: a prebuilt release binary at
# ./hipscope-bin or $HIPSCOPE_BIN; ncu on PATH; python3).
#
# 1. `synth llama-2-7b --quant Q4_0` (random weights in the real shapes), then
#    `bench -p 0 -n 8 --no-graphs --profile --json --trace` records a decode trace with every
#    kernel's device time (each kernel's own stamps, kernels/prelude.h; timed events for the
#    copies).
# 2. The same decode steps under `ncu --clock-control none --metrics gpu__time_duration.sum`:
#    the kernels of the last decode step, matched by position to the trace's (the step's launches
#    are the same at every step), grouped by the trace's op family; each family's share of the
#    step's kernel time in the trace against ncu's, within 10% (families over 1% of the step).
# 3. In every traced decode step: every layer's ops present, in layer order, the same ops in each
#    layer; the sum of the step's kernels within the step's wall time.
# 4. The cost: `bench -n 32` tokens/s without and with `--profile`, graphs on and off. The run
#    with `--profile` builds the stamped kernels (kernels/prelude.h HS_STAMPS), the one without
#    the ordinary ones, so this is what a traced run costs against an untraced one: the stamped
#    build's guard (3-4% of a 7B step on an H100, tracing off) and tracing itself. (`selftest`
#    measures tracing on one build.) As notes: every op timed by two timed events
#    (HIPSCOPE_TRACE_EVENTS=pairs) and by one (=ends), and the pairs trace's shares against ncu.
#
# Prints a short table and PASS/FAIL lines; exit 0 only when every check passes. Files: $OUT
# (default /tmp): trace-nographs.json, trace-pairs.json, bench-profile.json, ncu.csv,
# trace-check.log.
# Usage: scripts/device/trace-check.sh    Time: about 4-6 minutes on an H200 (the 7B file is
# written once, ~1 min; ncu replays ~1,300 kernels); each step is cut by `timeout` inside 8 min.
set -u
cd "$(dirname "$0")/../.."
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
OUT_DIR=${OUT:-/tmp}
LOG=$OUT_DIR/trace-check.log
MODEL=${MODEL:-/tmp/llama-2-7b-q4_0.gguf}
if [ ! -x "$BIN" ]; then
    echo "trace-check.sh: no hipscope binary at $BIN (set HIPSCOPE_BIN)" >&2
    exit 2
fi
for tool in python3 ncu; do
    command -v "$tool" >/dev/null || { echo "trace-check.sh: needs $tool on PATH" >&2; exit 2; }
done
BIN=$(realpath "$BIN")
mkdir -p "$OUT_DIR"
: >"$LOG"
deadline=$(($(date +%s) + 470))
left() { echo $((deadline - $(date +%s))); }
run() { # run LIMIT_S CMD...: logged, cut at the limit or at what is left of 8 minutes
    local lim=$1; shift
    local l; l=$(left)
    [ "$lim" -gt "$l" ] && lim=$l
    [ "$lim" -lt 5 ] && { echo "out of time before: $*" >>"$LOG"; return 124; }
    echo "+ $*" >>"$LOG"
    timeout --kill-after=10 "$lim" "$@"
}

if [ ! -s "$MODEL" ]; then
    run 240 "$BIN" synth llama-2-7b --quant Q4_0 -o "$MODEL" >>"$LOG" 2>&1 || {
        echo "FAIL: could not write the 7B synthetic model (see $LOG)"; exit 1; }
fi
common=(-m "$MODEL" --backend cuda -p 0)

# 1. The trace, launch by launch.
run 120 "$BIN" bench "${common[@]}" -r 1 -n 8 --no-graphs --profile --json \
    --trace "$OUT_DIR/trace-nographs.json" >"$OUT_DIR/bench-profile.json" 2>>"$LOG"
rc_trace=$?

# 2. ncu over the same decode steps (fewer of them: each kernel is replayed). With --log-file,
# ncu writes its CSV there (hipscope's own output goes to ncu-bench.txt).
run 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$OUT_DIR/ncu.csv" "$BIN" bench "${common[@]}" -r 1 -n 2 --no-graphs \
    >"$OUT_DIR/ncu-bench.txt" 2>>"$LOG"
rc_ncu=$?

# 4. The cost: tokens/s without and with the tracer, graphs on and off.
cost() { # cost GRAPHS_FLAG PROFILE_FLAG -> t/s
    run 60 "$BIN" bench "${common[@]}" -n 32 -r 2 $1 $2 --json 2>>"$LOG" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])' 2>>"$LOG" || echo nan
}
g_off=$(cost "" ""); g_on=$(cost "" --profile)
n_off=$(cost --no-graphs ""); n_on=$(cost --no-graphs --profile)
# Every op timed by two timed events (=pairs) or one (=ends): their cost, and the pairs' shares.
export HIPSCOPE_TRACE_EVENTS=ends
n_ends=$(cost --no-graphs --profile)
export HIPSCOPE_TRACE_EVENTS=pairs
n_pairs=$(cost --no-graphs --profile)
run 90 "$BIN" bench "${common[@]}" -r 1 -n 8 --no-graphs --trace "$OUT_DIR/trace-pairs.json" \
    >/dev/null 2>>"$LOG"
unset HIPSCOPE_TRACE_EVENTS

python3 - "$OUT_DIR" "$rc_trace" "$rc_ncu" "$g_off" "$g_on" "$n_off" "$n_on" "$n_ends" "$n_pairs" <<'EOF'
import csv, json, math, sys
from collections import OrderedDict, defaultdict
out, rc_trace, rc_ncu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g_off, g_on, n_off, n_on, n_ends, n_pairs = (float(x) for x in sys.argv[4:10])
ok = True
def verdict(good, what):
    global ok
    ok &= good
    print(("PASS  " if good else "FAIL  ") + what)

def parse_label(name):
    layer, rest = None, name
    if name.startswith("layer "):
        n, _, r = name[6:].partition(" · ")
        if n.isdigit():
            layer, rest = int(n), r
    op, _, kernel = rest.partition(" · ")
    return layer, op, kernel

def load(path):
    """A finished trace's decode steps (the last 8) and each step's kernels."""
    events = json.load(open(path))
    xs = [e for e in events if e.get("ph") == "X"]
    kern = defaultdict(list)
    for e in xs:
        if e.get("cat") == "kernel" and "step" in e.get("args", {}):
            kern[e["args"]["step"]].append(e)
    steps = sorted((e for e in xs if e["name"] == "decode step"), key=lambda s: s["args"]["step"])
    return len(xs), steps[-8:], kern

try:
    n_events, steps, kern = load(f"{out}/trace-nographs.json")
except Exception as e:
    verdict(False, f"trace-nographs.json does not parse ({e}); bench exited {rc_trace}")
    sys.exit(1)
print(f"trace: {n_events} events, {len(steps)} decode steps checked")

# 3. Layers in order, the same ops in each; kernels within the wall time.
layer_ok, wall_ok, per_step = True, True, []
for s in steps:
    ks = sorted(kern[s["args"]["step"]], key=lambda e: e["args"]["seq"])
    labels = [parse_label(k["name"]) for k in ks]
    layers = [l for l, _, _ in labels if l is not None]
    ops = defaultdict(list)
    for l, op, _ in labels:
        if l is not None:
            ops[l].append(op)
    if layers != sorted(layers) or sorted(ops) != list(range(32)) \
            or any(ops[l] != ops[0] for l in ops):
        layer_ok = False
    total = sum(k["dur"] for k in ks)
    if total > s["dur"] + 0.01:
        wall_ok = False
    per_step.append((s["dur"], total, len(ks)))
wall = sum(p[0] for p in per_step) / max(len(per_step), 1)
kt = sum(p[1] for p in per_step) / max(len(per_step), 1)
verdict(layer_ok and len(steps) > 0, "every layer 0-31 in order, the same ops in each, in every decode step")
verdict(wall_ok and len(steps) > 0,
        f"a step's kernels within its wall time (mean {kt:.0f} of {wall:.0f} µs, "
        f"{per_step[0][2] if per_step else 0} kernels a step)")
checked = [k for s in steps for k in kern[s["args"]["step"]]]
stamped = [k for k in checked if k["args"].get("timed by") == "kernel stamps"]
verdict(len(checked) > 0 and len(stamped) == len(checked),
        f"every kernel of those steps timed by its own stamps ({len(stamped)} of {len(checked)})")
durs = [round(k["dur"] * 1000) for k in stamped]
if durs:
    g = 0
    for d in durs:
        g = math.gcd(g, d)
    disp = sum(k["args"].get("dispatch µs", 0) for k in stamped) / max(len(steps), 1)
    print(f"NOTE  stamped kernels: {len(set(durs))} distinct lengths, their common divisor {g} ns "
          f"(the device clock's step shows here), shortest {min(durs)} ns; their dispatch "
          f"{disp:.0f} µs a step (counted in, as ncu counts it)")

# 2. ncu: the last decode step's kernels, by position.
rows = []
try:
    with open(f"{out}/ncu.csv") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            v = float(r["Metric Value"].replace(",", ""))
            unit = r.get("Metric Unit", "nsecond")
            us = v / 1000 if unit.startswith("n") else v if unit.startswith("u") else v * 1000
            rows.append((r["Kernel Name"], us))
except Exception as e:
    print(f"ncu.csv: {e}")
last = sorted(kern[steps[-1]["args"]["step"]], key=lambda e: e["args"]["seq"]) if steps else []
n = len(last)
if rc_ncu != 0 or len(rows) < n or n == 0:
    verdict(False, f"ncu gave {len(rows)} kernels (exit {rc_ncu}), a step has {n}")
else:
    nc = rows[-n:]
    same = sum(1 for (kn, _), e in zip(nc, last) if parse_label(e["name"])[2] and parse_label(e["name"])[2].split()[0] in kn)
    def families(steps, kern):
        f = OrderedDict()
        for s in steps:
            for e in kern[s["args"]["step"]]:
                op = parse_label(e["name"])[1]
                f[op] = f.get(op, 0) + e["dur"] / len(steps)
        return f
    fam_t, fam_n = families(steps, kern), OrderedDict()
    for (kn, us), e in zip(nc, last):
        op = parse_label(e["name"])[1]
        fam_n[op] = fam_n.get(op, 0) + us
    tt, tn = sum(fam_t.values()), sum(fam_n.values())
    print(f"ncu: {len(rows)} kernels; the last step's {n} matched by position "
          f"({same} of {n} ncu names contain the trace's kernel name); kernel time a step: "
          f"trace {tt:.0f} µs, ncu {tn:.0f} µs")
    print(f"  {'op family':<24} {'trace µs':>9} {'share':>7} {'ncu µs':>9} {'share':>7} {'diff':>7}")
    worst = 0.0
    for op in sorted(fam_n, key=lambda o: -fam_n[o]):
        st, sn = fam_t.get(op, 0) / tt, fam_n[op] / tn
        d = (st - sn) / sn if sn > 0 else math.inf
        if sn >= 0.01:
            worst = max(worst, abs(d))
        print(f"  {op[:24]:<24} {fam_t.get(op, 0):>9.1f} {100*st:>6.1f}% {fam_n[op]:>9.1f} "
              f"{100*sn:>6.1f}% {100*d:>+6.1f}%")
    verdict(worst <= 0.10, f"per-op shares within 10% of ncu's (worst {100*worst:.1f}%, families over 1%)")
    try:
        _, es, ek = load(f"{out}/trace-pairs.json")
        fe = families(es, ek)
        te = sum(fe.values())
        we = max(abs(fe.get(op, 0) / te - fam_n[op] / tn) / (fam_n[op] / tn)
                 for op in fam_n if fam_n[op] / tn >= 0.01)
        print(f"NOTE  HIPSCOPE_TRACE_EVENTS=pairs (two events a launch): kernel time a step "
              f"{te:.0f} µs, worst share {100*we:.1f}% off ncu's")
    except Exception as e:
        print(f"NOTE  trace-pairs.json: {e}")

# 4. Cost.
def pct(off, on):
    return (off / on - 1) * 100 if on > 0 and not math.isnan(on) else math.nan
cg, cn = pct(g_off, g_on), pct(n_off, n_on)
print(f"cost (bench tg32, 7B Q4_0): graphs {g_off:.1f} → {g_on:.1f} t/s ({cg:+.1f}% a step); "
      f"no graphs {n_off:.1f} → {n_on:.1f} t/s ({cn:+.1f}% a step)")
verdict(cg <= 5.0, "a traced run's decode step at most 5% slower than an untraced one's, with graphs")
verdict(cn <= 5.0, "a traced run's decode step at most 5% slower than an untraced one's, without "
        "graphs (the stamped build against the ordinary one)")
print(f"NOTE  without graphs, two timed events a launch (=pairs): {n_off:.1f} → {n_pairs:.1f} t/s "
      f"({pct(n_off, n_pairs):+.1f}% a step); one (=ends): {n_ends:.1f} t/s "
      f"({pct(n_off, n_ends):+.1f}% a step)")
sys.exit(0 if ok else 1)
EOF
