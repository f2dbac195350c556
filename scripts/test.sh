#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), prepares the assets the tests
# read (scripts/test-assets.sh: the real model, llama.cpp's tokenizer conformance files, the ROCm
# chroot), then formatting, lints and every test. Arguments go to `cargo test`.
# Works on a fresh Debian or Ubuntu machine with a Rust toolchain; root or sudo installs packages.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked --no-run
# An assignment keeps the exit status: a failed asset step stops here, with its own message.
assets=$(scripts/test-assets.sh) || {
    echo "scripts/test.sh: preparing the test assets failed (see above)" >&2
    exit 1
}
eval "$assets"
# A new or changed snapshot fails the run instead of being accepted.
export INSTA_UPDATE=no CI=true
cargo test --locked "$@"
