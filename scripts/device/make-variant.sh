#!/usr/bin/env bash
# A kernel variant to measure on the device beside the shipped kernels, without another binary:
# the shipped kernels/ with scripts/device/variants/NAME.patch applied, into .device-carry/kv/NAME,
# which a device call hands to hipscope as HIPSCOPE_KERNELS (issue33-call.sh:
# VARIANTS="NAME=.device-carry/kv/NAME"). A variant that wins is merged into kernels/ and its
# patch removed; one that has not been measured yet stays here, so that it is not lost.
#   scripts/device/make-variant.sh NAME...
# VARIANTS measured so far: att (decode attention a warp per key turn) on an H100, 2026-12-07:
# slower on Qwen 3 at depth, level on Gemma 3 — dropped (docs/PERFORMANCE.md; the patch is in git
# history, commit 096d211). No variant waits to be measured now.
set -euo pipefail
cd "$(dirname "$0")/../.."
for name in "$@"; do
    patch=scripts/device/variants/$name.patch
    [ -f "$patch" ] || { echo "make-variant.sh: no $patch" >&2; exit 2; }
    dest=.device-carry/kv/$name
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    cp -r kernels "$dest"
    patch -s -d "$dest" -p2 <"$patch"
    echo "$dest"
done
