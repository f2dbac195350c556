#!/usr/bin/env bash
# Nsight Compute's detail of a few hipscope kernels in a decode step (one launch each, after the
# first steps): duration, launch shape, registers, local memory, occupancy, the warp stall
# reasons. Runs on the device machine with HIPSCOPE_BIN and the files of issue33-call.sh in
# $WORK. Output: $OUT/ncu-detail.log.
#   KERNELS="hs_moe_route|hs_mv_f32" FILE=q30-q4_0 scripts/device/ncu-detail.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${HIPSCOPE_BIN:-./hipscope-bin}")
WORK=${WORK:-/tmp/i33}
OUT_DIR=${OUT:-/tmp}
LOG=$OUT_DIR/ncu-detail.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu-detail.sh: no ncu on this machine" | tee -a "$LOG"; exit 2; }
echo "== ${FILE:-q30-q4_0}: ${KERNELS:-hs_moe_route|hs_mv_f32}" >>"$LOG"
timeout "${NCU_S:-150}" "$NCU" --clock-control none -k "regex:${KERNELS:-hs_moe_route|hs_mv_f32}" \
    --launch-skip "${SKIP:-96}" --launch-count "${COUNT:-2}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --print-details all \
    "$BIN" bench -m "$WORK/${FILE:-q30-q4_0}.gguf" -p 0 -n 4 -r 1 2>&1 |
    grep -vE '^\s*$|^\|' | grep -E 'hs_|Duration|Registers|Local|Stack|Achieved Occupancy|Theoretical Occ|Block Size|Grid Size|Stall|stall|cycles|Warp Cycles|Issued|Memory Throughput|DRAM|L1|L2|Shared Memory Config|Waves|OPT|Est' |
    head -"${LINES_MAX:-160}" >>"$LOG"
