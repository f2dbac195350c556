#!/usr/bin/env bash
# The tuning knobs after issue 30 item 1: read once at the app edge (`app/settings.rs`) and passed
# down as `ComputeOptions`/`CpuOptions`, so that nothing under src/gpu reads the environment. On a
# GPU machine (no Rust there: a prebuilt release binary at ./hipscope-bin or $HIPSCOPE_BIN) this
# checks that each knob still reaches the backend, then prints a short table.
#
# - `selftest`'s `prefill` line for HIPSCOPE_PREFILL_GEMM unset, own and f32 (the forced path is
#   named), and a bad value refused with exit code 2;
# - `bench` on a synthetic SmolLM2-135M Q4_0 (pp512, tg64, 2 repetitions) with the defaults,
#   HIPSCOPE_PREFILL_GEMM=f32, HIPSCOPE_GEMM_MIN_TOKENS=100000 (prompts through the matrix-vector
#   kernels: pp must fall) and HIPSCOPE_MV_ACT=f32 (tg moves a little, the f32-activation
#   kernels run);
# - the CPU: HIPSCOPE_CPU_ISA=scalar and HIPSCOPE_CPU_REPACK=0 named in bench's `cpu kernels` line.
#
# Usage: scripts/device/trust-tuning-knobs.sh   Time: about 2-4 minutes (kernel compile first).
set -u
cd "$(dirname "$0")/../.."
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
OUT_DIR=${OUT:-/tmp}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/trust-tuning-knobs.log
: >"$LOG"
if [ ! -x "$BIN" ]; then
    echo "trust-tuning-knobs.sh: no hipscope binary at $BIN (set HIPSCOPE_BIN)" >&2
    exit 2
fi
export HIPSCOPE_HOME=${HIPSCOPE_HOME:-$OUT_DIR/hipscope-home}
fail=0

echo "== selftest prefill line" | tee -a "$LOG"
for v in "" own f32; do
    line=$(HIPSCOPE_PREFILL_GEMM=$v timeout 300 "$BIN" selftest 2>>"$LOG" | tee -a "$LOG" | grep -m1 '^prefill')
    printf '%-22s %s\n' "PREFILL_GEMM=${v:-unset}" "$line"
    if [ -n "$v" ] && ! grep -qi "$v\|f32\|own" <<<"$line"; then fail=1; fi
done
HIPSCOPE_PREFILL_GEMM=bogus timeout 60 "$BIN" bench --synthetic tiny -p 8 -n 2 -r 1 >>"$LOG" 2>&1
rc=$?
printf '%-22s exit %s (want 2)\n' "PREFILL_GEMM=bogus" "$rc"
[ "$rc" = 2 ] || fail=1

echo "== bench smollm2-135m Q4_0, pp512 / tg64 (t/s)" | tee -a "$LOG"
bench() {
    env "$@" timeout 300 "$BIN" bench --synthetic smollm2-135m --quant Q4_0 -p 512 -n 64 -r 2 \
        --json 2>>"$LOG" | tee -a "$LOG"
}
rate() { python3 -c 'import json,sys
try: rows=json.loads(sys.stdin.read())
except ValueError: rows=[]
pp=[r for r in rows if r.get("n_prompt",0)>0]; tg=[r for r in rows if r.get("n_gen",0)>0]
f=lambda rs: "%.0f" % rs[0]["avg_ts"] if rs else "-"
print(f(pp), f(tg))'; }
declare -A pp tg
for knob in NONE=1 HIPSCOPE_PREFILL_GEMM=f32 HIPSCOPE_GEMM_MIN_TOKENS=100000 HIPSCOPE_MV_ACT=f32; do
    read -r p t < <(bench "$knob" | rate)
    pp[$knob]=$p
    tg[$knob]=$t
    printf '%-34s pp %8s   tg %8s\n' "$knob" "$p" "$t"
done
# Prompts through the matrix-vector kernels are far slower than through a GEMM.
python3 - "${pp[NONE=1]}" "${pp[HIPSCOPE_GEMM_MIN_TOKENS=100000]}" <<'EOF' || fail=1
import sys
a, b = sys.argv[1:3]
ok = a not in ("-", "") and b not in ("-", "") and float(b) < 0.8 * float(a)
print("GEMM_MIN_TOKENS reaches the backend:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
EOF

echo "== cpu kernels line" | tee -a "$LOG"
for knob in NONE=1 HIPSCOPE_CPU_ISA=scalar HIPSCOPE_CPU_REPACK=0; do
    line=$(env "$knob" timeout 120 "$BIN" bench --synthetic tiny -p 16 -n 4 -r 1 --backend cpu 2>>"$LOG" | grep -m1 'cpu kernels')
    printf '%-26s %s\n' "$knob" "$line"
    case $knob in
        *ISA=scalar) grep -q 'scalar' <<<"$line" || fail=1 ;;
        *REPACK=0) grep -q 'repacked' <<<"$line" && fail=1 ;;
    esac
done
echo "verdict: $([ $fail = 0 ] && echo PASS || echo FAIL) (log: $LOG)"
exit $fail
