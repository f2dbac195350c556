#!/usr/bin/env bash
# `hipscope selftest --compute --ops` on the device machine (a CUDA or ROCm GPU; no Rust there:
# a prebuilt release binary at ./hipscope-bin or $HIPSCOPE_BIN), then a short table.
#
# The default matrix exercises every fused decode kernel the GPU has: one-token Q/K/V (with
# qwen2's biases), gate/up with SwiGLU and a product with the residual add, in every type with
# fused kernels (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K on every shape; Q5_0, Q5_1, Q5_K on `tiny`), and
# RoPE fused with the KV-cache write (plain and NeoX pairs, llama 3's and Phi-3's frequency
# factors, gpt-oss's YaRN, sliding windows, an f32 and an f16 cache; Qwen 3's and Gemma 3's
# per-head norms inside that launch), Gemma's GeGLU product and its norms with the residual
# add. Each is compared op by op
# with the CPU running the same op as its separate ops (`src/gpu/compute/lockstep.rs`), bound
# 1e-5 (the same integer dot products and RoPE angles, another summation order).
#
# Prints: each fused op kind with its calls, worst ‖gpu−cpu‖/‖cpu‖, bound and ratio; every case
# that failed; the worst op ratio over the whole run; the verdict. On the default matrix (no
# arguments) a fused kind that never ran fails the check (its kernels were not exercised). The
# full log is $OUT/selftest-compute.log.
#
# Usage: scripts/device/selftest-compute.sh [more selftest args, e.g. --shapes tiny --quants Q4_0]
# Time: about 3-5 minutes on an H100/H200 (kernel compile on a fresh machine ~1 min, ~80 cases of
# 0.1-3 s each run twice (end to end and op by op), gpt-oss-20b-2l ~20 s per type); the run is cut
# at $LIMIT_S seconds (default 560), inside the device's 10 minutes a command.
set -u
cd "$(dirname "$0")/../.."
BIN=${HIPSCOPE_BIN:-./hipscope-bin}
LIMIT_S=${LIMIT_S:-560}
OUT_DIR=${OUT:-/tmp}
LOG=$OUT_DIR/selftest-compute.log
if [ ! -x "$BIN" ]; then
    echo "selftest-compute.sh: no hipscope binary at $BIN (set HIPSCOPE_BIN)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
start=$(date +%s)
timeout --kill-after=20 "$LIMIT_S" "$BIN" selftest --compute --ops "$@" >"$LOG" 2>&1
rc=$?
secs=$(($(date +%s) - start))

grep -m1 '^device:' "$LOG"
# With arguments the matrix is the caller's: a fused kind it does not reach is shown, not failed.
full=$(($# == 0))
awk -v rc="$rc" -v secs="$secs" -v full="$full" '
    function times(x) { return x >= 1e300 ? "inf×" : sprintf("%.2f×", x) }
    # Per-op rows (--ops): "    KIND  rel R (bound B) over N calls, worst at WHERE".
    /^    .* rel .*\(bound .*\) over .* calls, worst at / {
        line = $0
        sub(/^    /, "", line)
        kind = line
        sub(/ +rel .*/, "", kind)
        r = line
        sub(/.* rel +/, "", r)
        sub(/ .*/, "", r)
        b = line
        sub(/.*\(bound /, "", b)
        sub(/\).*/, "", b)
        n = line
        sub(/.*\) over +/, "", n)
        sub(/ calls.*/, "", n)
        ratio = (r == "inf" || r == "NaN") ? 1e300 : r / b
        calls[kind] += n
        bound[kind] = b
        if (!(kind in worst) || ratio > worst[kind]) {
            worst[kind] = ratio
            rel[kind] = r
            at[kind] = current
        }
        if (ratio > top) { top = ratio; top_at = current " " kind }
        next
    }
    # Case rows end with the verdict; the "worst op" column ends in ×.
    / (PASS|PASS \(per op\)|FAIL)$/ {
        current = $1 " " $2 " " $3
        sub(/,$/, "", current)
        if ($0 ~ /FAIL$/) { failed[++nf] = $0 }
        cases++
        next
    }
    / error[ :]/ { failed[++nf] = $0; cases++ }
    END {
        split("Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K", types, " ")
        split("matmul_qkv matmul_swiglu matmul_add", ops, " ")
        n = 0
        for (o = 1; o <= 3; o++)
            for (t = 1; t <= 8; t++)
                want[++n] = ops[o] " " types[t] " (mv fused)"
        want[++n] = "rope + kv_store (fused)"
        want[++n] = "rope (neox) + kv_store (fused)"
        # The head norms of Qwen 3 and Gemma 3 in the rotation, the GeGLU and post-norms of Gemma.
        want[++n] = "qk_norm + rope (neox) + kv_store (fused)"
        split("Q4_0 Q4_1 Q8_0 Q4_K Q6_K", gtypes, " ")
        for (t = 1; t <= 5; t++)
            want[++n] = "matmul_geglu " gtypes[t] " (mv fused)"
        want[++n] = "rms_norm + add (fused)"
        printf "\n%-42s %7s %10s %7s %7s  %s\n", "fused op (vs the CPU)", "calls", "worst rel", "bound", "ratio", "worst case"
        missing = 0
        for (i = 1; i <= n; i++) {
            k = want[i]
            if (k in worst) {
                printf "%-42s %7d %10s %7s %7s  %s\n", k, calls[k], rel[k], bound[k], times(worst[k]), at[k]
                if (worst[k] > 1) bad++
            } else {
                printf "%-42s %7s %10s %7s %7s  %s\n", k, "-", "-", "-", "-", "not exercised"
                if (full) missing++
            }
        }
        printf "\n"
        for (i = 1; i <= nf; i++) {
            f = failed[i]
            gsub(/ +/, " ", f)
            print "failed: " f
        }
        printf "cases: %d, failed: %d; worst op of the whole run: %s its bound (%s); %d s, selftest exit %d\n", cases, nf, times(top), top_at, secs, rc
        ok = (rc == 0 && nf == 0 && missing == 0 && bad == 0 && cases > 0)
        if (rc == 124 || rc == 137) print "the run was cut at the time limit: the table covers what ran"
        print (ok ? "RESULT: PASS" : "RESULT: FAIL")
        exit (ok ? 0 : 1)
    }
' "$LOG"
