#!/bin/sh
# Builds a minimal Debian trixie chroot with HIP/hiprtc 5.7.1 (LLVM 17), whose compiler knows the
# gfx11 targets (gfx1100, gfx1151) that Debian bookworm's ROCm 5.2 aborts on. tests/it/hip_gfx11.rs
# runs `hipscope kernels --compile --arch gfx1100,gfx1151` inside it.
#
# usage: scripts/rocm-chroot.sh DIR        (as root; needs debootstrap and network access)
#
# Idempotent: if DIR already holds a finished chroot with the packages, it exits at once.
# The mirror is the Debian mirror apt already uses on this machine (/etc/apt/sources.list and
# /etc/apt/sources.list.d/*), falling back to http://deb.debian.org/debian.
set -eu

PACKAGES="libamdhip64-5 libhiprtc-builtins5 rocm-device-libs-17"
SUITE=trixie

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$1
MARKER="$DIR/.hipscope-rocm-chroot"

if [ "$(id -u)" != 0 ]; then
    echo "$0: must run as root (debootstrap and chroot need it)" >&2
    exit 2
fi

# Quick path: finished before, and the packages are still installed.
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$PACKAGES" ]; then
    # shellcheck disable=SC2086
    if chroot "$DIR" dpkg-query -W -f='${Status}\n' $PACKAGES 2>/dev/null \
        | grep -qv '^install ok installed$'; then
        echo "$0: $DIR is incomplete; finishing it" >&2
    else
        echo "$DIR: ready ($PACKAGES)"
        exit 0
    fi
fi

command -v debootstrap >/dev/null 2>&1 || {
    echo "$0: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 2
}

# The first non-security Debian mirror apt uses here.
mirror() {
    {
        # deb822 .sources files: "URIs: http://… …"
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] && sed -n 's/^URIs:[[:space:]]*//p' "$f" | tr ' ' '\n'
        done
        # one-line format: "deb [options] URL suite components"
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -f "$f" ] && sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f"
        done
    } | grep -E '^https?://' | grep -v -e security -e updates | grep -E '/debian/?$' | head -n 1
}
MIRROR=$(mirror || true)
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
echo "mirror: $MIRROR"

mkdir -p "$DIR"
if [ ! -x "$DIR/usr/bin/apt-get" ]; then
    debootstrap --variant=minbase "$SUITE" "$DIR" "$MIRROR"
fi

# Name resolution inside the chroot for apt.
cp -L /etc/resolv.conf "$DIR/etc/resolv.conf" 2>/dev/null || true
chroot "$DIR" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    apt-get update -q
# shellcheck disable=SC2086
chroot "$DIR" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends $PACKAGES
chroot "$DIR" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get clean
# The package lists (~90 MB) are only needed to install; a repair run fetches them again.
rm -rf "$DIR"/var/lib/apt/lists/*

echo "$PACKAGES" > "$MARKER"
echo "$DIR: ready ($PACKAGES)"
