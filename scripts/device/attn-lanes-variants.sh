#!/usr/bin/env bash
# Decode attention variants to measure on the device beside the shipped kernels, without another
# binary: copies of kernels/ whose attention.h defaults HS_ATTN_KEY_LANES and HS_ATTN_KEY_LANES_WIDE
# (the lanes that score one key together in attn_keys, kernels/infer_attention.hip, below and from
# heads of 128) to L, into .device-carry/kv/lanesL,
# which a device call hands to hipscope as HIPSCOPE_KERNELS (issue33-call.sh:
# VARIANTS="lanes4=.device-carry/kv/lanes4"), as make-variant.sh makes its patched variants.
# The shipped defaults (1 and 2) are what the H100 measured fastest on 2026-12-07 (attention.h).
#   scripts/device/attn-lanes-variants.sh [L...]     (default: 2 4 8)
set -euo pipefail
cd "$(dirname "$0")/../.."
lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(2 4 8)
for l in "${lanes[@]}"; do
    case $l in
        1 | 2 | 4 | 8 | 16 | 32) ;;
        *) echo "attn-lanes-variants.sh: L must be a power of two from 1 to 32, not $l" >&2; exit 2 ;;
    esac
    dest=.device-carry/kv/lanes$l
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    cp -r kernels "$dest"
    sed -i -e "s/^#define HS_ATTN_KEY_LANES [0-9]*\$/#define HS_ATTN_KEY_LANES $l/" \
        -e "s/^#define HS_ATTN_KEY_LANES_WIDE [0-9]*\$/#define HS_ATTN_KEY_LANES_WIDE $l/" "$dest/attention.h"
    grep -qx "#define HS_ATTN_KEY_LANES_WIDE $l" "$dest/attention.h" || {
        echo "attn-lanes-variants.sh: no default of HS_ATTN_KEY_LANES to change in $dest/attention.h" >&2
        exit 1
    }
    echo "$dest"
done
