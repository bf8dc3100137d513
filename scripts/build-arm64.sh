#!/usr/bin/env bash
# Cross-builds `weft` for arm64 (aarch64-unknown-linux-gnu) and prints the binary's
# path, for the end-to-end test that runs it under qemu-user (cli/tests/e2e_arm64.rs).
# Built with scripts/quick-release.sh (release without optimisation, LTO or debug info),
# since the test proves the port, not its speed: CI's package test then finds the same
# arm64 build done (packaging/build.sh --arch arm64 alone builds the optimised one). Installs what it needs when missing: the Rust
# target, Debian's cross gcc and arm64 libc, and qemu-user-static.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
scripts/arm64-tools.sh >&2
echo "cross-building weft for $target (quick release: scripts/quick-release.sh)" >&2
scripts/quick-release.sh cargo build --locked --release -p weft --target "$target" >&2
echo "${QUICK_TARGET_DIR:-$PWD/target/quick}/$target/release/weft"
