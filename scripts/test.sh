#!/usr/bin/env bash
# The test command: formatting, lints, then every test, with the real model, llama.cpp's
# tokenizer conformance files and the ROCm chroot prepared by scripts/test-assets.sh.
# Needs: a Rust toolchain, Debian's libamdhip64-dev (HIP tests fail without it, by design),
# python3 with numpy and PyYAML (the gguf interop test), curl, and root with debootstrap for the gfx11 chroot.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked --no-run
eval "$(scripts/test-assets.sh)"
# A new or changed snapshot fails the run instead of being accepted.
export INSTA_UPDATE=no CI=true
cargo test --locked "$@"
