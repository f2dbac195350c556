#!/usr/bin/env bash
# A kernel variant to measure on the device beside the shipped kernels, without another binary:
# the shipped kernels/ with scripts/device/variants/NAME.patch applied, into .device-carry/kv/NAME,
# which a device call hands to hipscope as HIPSCOPE_KERNELS (issue33-call.sh:
# VARIANTS="NAME=.device-carry/kv/NAME"). A variant that wins is merged into kernels/ and its
# patch removed; one that has not been measured yet stays here, so that it is not lost.
#   scripts/device/make-variant.sh NAME...
# Variants:
#   att  decode attention a warp per key turn (llama.cpp's vector-kernel plan): a group of lanes
#        reads each key row coalesced, each warp its own online softmax over its turns, two
#        turns' key and value rows loaded at once, no barrier in the walk, the warps merged at
#        the end. Passes the kernel emulation's every case (tests/it/kernel_emulation.rs).
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
