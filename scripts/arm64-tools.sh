#!/usr/bin/env bash
# Installs what cross-building and running arm64 weft needs, when it is missing: the
# Rust target, Debian's cross gcc and arm64 libc, and qemu-user-static (which runs
# arm64 binaries here: qemu-aarch64-static -L /usr/aarch64-linux-gnu BINARY).
set -euo pipefail
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    echo "adding the Rust target aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu
fi
need=()
for tool in aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu qemu-aarch64-static:qemu-user-static; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: arm64 builds need ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
        exit 2
    fi
    echo "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
