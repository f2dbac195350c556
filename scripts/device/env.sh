# What the device scripts share (sourced first by issue33-table.sh, ncu-step.sh, profile-call.sh):
# the repository root as the working directory, and where the binaries, files and output are.
#   BIN      hipscope, $HIPSCOPE_BIN (default ./hipscope-bin), as an absolute path
#   LB       llama-bench, $LLAMA_BENCH (may be empty: the scripts say what they need)
#   WORK     the synth files and raw outputs, $WORK (default /tmp/i33)
#   OUT_DIR  what comes back from the call, $OUT (default /tmp); both made if missing
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${HIPSCOPE_BIN:-./hipscope-bin}")
LB=${LLAMA_BENCH:-}
WORK=${WORK:-/tmp/i33}
OUT_DIR=${OUT:-/tmp}
mkdir -p "$WORK" "$OUT_DIR"
