#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), prepares the assets the tests
# read (scripts/test-assets.sh: the real model, llama.cpp's sources, llama-server, the ROCm
# chroot), then formatting, lints and every test. Arguments go to `cargo test`.
#
# Root: on a fresh Debian or Ubuntu machine this installs packages (apt-get), builds a Debian
# chroot (debootstrap) and compiles kernels inside it (chroot), through sudo when not root. A user
# who cannot become root (no sudo, or HIPSCOPE_TEST_NO_ROOT=1) gets every test that needs no root;
# the ones left out are listed with the reason, and the last line says "N tests NOT RUN". CI
# (.ci/run) runs as root and runs them all.
#
# Exit status: 0 every test ran and passed (or the only ones not run need a processor feature
# this machine lacks, listed as NOT RUN); 1 a step or a test failed; 3 every test that ran
# passed, but some were NOT RUN for want of a package or root (never a pass).
#
# Each phase's wall time is printed as it ends, with the machine's load, and again as a table at
# the end (docs/TESTING.md has the measured figures).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .ci-cache

timings=()
times_file=$(mktemp)
# cpu_of FILE: the CPU seconds (user and system) of the children, from the `times` output in FILE.
cpu_of() {
    awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
        printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$1"
}
# timed NAME COMMAND...: runs COMMAND, noting its wall time and CPU time. In a subshell, whose
# `times` count its own children only (not the asset steps running beside it).
timed() {
    local name=$1 start=$EPOCHREALTIME
    shift
    (
        "$@"
        times >"$times_file"
    )
    note_time "$name" "$start" "$(cpu_of "$times_file")"
}
# note_time NAME START_WALL CPU_SECONDS
note_time() {
    local took
    took=$(awk -v a="$2" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
    timings+=("$(printf '%-26s %5d s wall %6d s CPU   load %s' "$1" "$took" "$3" "$(cut -d' ' -f1 /proc/loadavg)")")
    echo "scripts/test.sh: $1: ${took} s, $3 s of CPU (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
}
all_start=$EPOCHREALTIME

# Who may become root: uid 0, or sudo (which may ask for the password here, once).
if [ "${HIPSCOPE_TEST_NO_ROOT:-}" != 1 ] && [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null || ! sudo -v; then
        echo "scripts/test.sh: no root and no sudo: running every test that needs neither" >&2
        HIPSCOPE_TEST_NO_ROOT=1
    fi
fi
export HIPSCOPE_TEST_NO_ROOT=${HIPSCOPE_TEST_NO_ROOT:-}

missing_file=$(mktemp)
bg=()
# On the way out, early or not: the asset steps still running (each in a session of its own,
# by setsid, with its children) end.
cleanup() {
    rm -f "$missing_file" "$times_file"
    for pid in "${bg[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
HIPSCOPE_SETUP_MISSING=$missing_file timed setup scripts/setup.sh
mapfile -t missing <"$missing_file"
for p in "${missing[@]}"; do
    case $p in gcc | libc6-dev)
        echo "scripts/test.sh: no C compiler and linker (gcc, libc6-dev), which Rust links with; installing them needs root: sudo apt-get install gcc libc6-dev" >&2
        exit 1
        ;;
    esac
done

# The assets that take long and use little of this machine's CPU, or use it while the Rust build
# leaves a core idle, are prepared beside the lints and the build: the ROCm chroot (network and
# dpkg), and llama.cpp's sources (a download) then llama-server (a C++ build, niced). The model is
# fetched afterwards, by the binary just built. Each step's messages go to .ci-cache/assets-*.log.
assets_start=$EPOCHREALTIME
# Each step's own CPU time is written beside its log (`times` of its shell).
setsid bash -c 'scripts/test-assets.sh chroot >.ci-cache/assets-chroot.env
    rc=$?; times >.ci-cache/assets-chroot.times; exit $rc' 2>.ci-cache/assets-chroot.log &
chroot_pid=$!
bg+=("$chroot_pid")
setsid bash -c 'scripts/test-assets.sh sources >.ci-cache/assets-sources.env &&
    nice -n 5 scripts/test-assets.sh server >.ci-cache/assets-server.env
    rc=$?; times >.ci-cache/assets-server.times; exit $rc' 2>.ci-cache/assets-server.log &
server_pid=$!
bg+=("$server_pid")

timed fmt cargo fmt --check
timed clippy cargo clippy --all-targets --locked -- -D warnings
timed build cargo test --locked --no-run
assets_failed() {
    cat "$@" >&2
    echo "scripts/test.sh: preparing the test assets failed (see above)" >&2
    exit 1
}
# An assignment keeps the exit status: a failed asset step stops here, with its own message.
model_env=$(scripts/test-assets.sh model) || assets_failed
wait "$server_pid" || assets_failed .ci-cache/assets-server.log
wait "$chroot_pid" || assets_failed .ci-cache/assets-chroot.log
bg=()
note_time "assets (beside the above)" "$assets_start" \
    $(($(cpu_of .ci-cache/assets-chroot.times) + $(cpu_of .ci-cache/assets-server.times)))
eval "$model_env"
for step in sources server chroot; do
    eval "$(cat ".ci-cache/assets-$step.env")"
done

# What could not be had leaves out the tests that need it, each with the reason.
skips=()
reasons=()
leave_out() { # leave_out REASON MODULE...: the tests in tests/it/MODULE.rs
    local reason=$1
    shift
    for m in "$@"; do
        skips+=("$m::")
        reasons+=("tests/it/$m.rs: $reason")
    done
}
if printf '%s\n' "${missing[@]}" | grep -qx -e libamdhip64-dev -e librocm-smi-dev; then
    leave_out "the real HIP runtime (libamdhip64-dev, librocm-smi-dev) is not installed; installing it needs root" hip_runtime
fi
if printf '%s\n' "${missing[@]}" | grep -qx -e python3-numpy -e python3-yaml -e python3; then
    leave_out "python3 with numpy and PyYAML is not installed; installing it needs root" gguf_interop quant_mxfp4
fi
if [ "$HIPSCOPE_TEST_NO_ROOT" = 1 ]; then
    leave_out "reads hipscope's files as another user (setpriv), which needs root" private_files
    leave_out "fills a small tmpfs it mounts, which needs root" disk_full
fi
if [ -z "${HIPSCOPE_TRIXIE_ROOT:-}" ]; then
    leave_out "compiles the gfx11 kernels in a Debian trixie chroot: debootstrap and chroot need root" hip_gfx11
fi
if [ -z "${HIPSCOPE_LLAMA_CPP_SRC:-}" ]; then
    leave_out "needs llama.cpp's sources, which could not be downloaded (curl is not installed)" \
        gguf_interop quant_mxfp4 reasoning_templates template_reference tokenizer_conformance
fi
if [ -z "${HIPSCOPE_LLAMA_SERVER:-}" ]; then
    leave_out "needs llama-server, which could not be built (cmake or g++ is not installed, or the sources are missing)" remote_llama
fi

# Tests of code this machine's processor cannot execute: listed as NOT RUN like the others, but
# they leave the exit status alone (nothing a runner installs would let them run here; on a
# machine that has the hardware they run and count). No emulator stands in: QEMU's TCG has no
# AVX-512, and Intel's SDE cannot be downloaded from a build machine.
hw_skips=()
hw_reasons=()
if [ "$(uname -m)" = x86_64 ]; then
    missing_avx512=$(for f in avx512f avx512bw avx512vl avx512_vnni; do
        grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f" || echo "$f"; done | tr '\n' ' ')
    if [ -n "$missing_avx512" ]; then
        hw_skips+=("gpu::cpu::attention::x86_512::")
        hw_reasons+=("src/gpu/cpu/attention/x86_512.rs (the AVX-512 attention kernel's own tests): this CPU lacks ${missing_avx512% }")
    fi
fi

# A new or changed snapshot fails the run instead of being accepted.
export INSTA_UPDATE=no CI=true
# The caller's arguments: cargo's, then (after `--`) the test harness's; the leave-outs go to
# the harness.
cargo_args=()
harness_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    cargo_args+=("$1")
    shift
done
[ $# -gt 0 ] && shift
harness_args=("$@")
skip_args=()
for s in "${skips[@]}" "${hw_skips[@]}"; do skip_args+=(--skip "$s"); done
tests_start=$EPOCHREALTIME
status=0
(
    # Every test binary runs even after one fails: the run reports all failures at once.
    cargo test --locked --no-fail-fast "${cargo_args[@]}" -- "${harness_args[@]}" "${skip_args[@]}" ||
        status=$?
    times >"$times_file"
    exit "$status"
) || status=$?
note_time tests "$tests_start" "$(cpu_of "$times_file")"

echo >&2
echo "scripts/test.sh: phases (wall time; the assets overlap fmt, clippy and build):" >&2
printf '  %s\n' "${timings[@]}" >&2
times >"$times_file"
note_time "total (this shell's children)" "$all_start" "$(cpu_of "$times_file")"
echo "  ${timings[-1]}" >&2
if [ ${#skips[@]} -gt 0 ]; then
    # How many tests the leave-outs covered: the names `--skip` matches in the full list.
    not_run=$(cargo test --locked "${cargo_args[@]}" -- --list --format terse "${harness_args[@]}" 2>/dev/null |
        grep ': test$' | grep -cF "$(printf '%s\n' "${skips[@]}")" || true)
    echo "scripts/test.sh: left out, and why:" >&2
    printf '  %s\n' "${reasons[@]}" | sort -u >&2
fi
if [ ${#hw_skips[@]} -gt 0 ]; then
    hw_not_run=$(cargo test --locked "${cargo_args[@]}" -- --list --format terse "${harness_args[@]}" 2>/dev/null |
        grep ': test$' | grep -cF "$(printf '%s\n' "${hw_skips[@]}")" || true)
    echo "scripts/test.sh: $hw_not_run tests NOT RUN: this machine's processor cannot execute their code:" >&2
    printf '  %s\n' "${hw_reasons[@]}" >&2
fi
if [ "$status" != 0 ]; then
    echo "scripts/test.sh: FAILED (cargo test exit status $status)${not_run:+; $not_run tests NOT RUN}" >&2
    exit 1
fi
if [ ${#skips[@]} -gt 0 ]; then
    echo "scripts/test.sh: every test that ran passed; $not_run tests NOT RUN (listed above)" >&2
    exit 3
fi
if [ ${#hw_skips[@]} -gt 0 ]; then
    echo "scripts/test.sh: every test that ran passed; $hw_not_run tests NOT RUN for want of this machine's hardware (listed above)" >&2
    exit 0
fi
echo "scripts/test.sh: every test ran and passed" >&2
