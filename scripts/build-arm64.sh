#!/usr/bin/env bash
# Cross-builds `weft` for arm64 (aarch64-unknown-linux-gnu) and prints the binary's
# path, for the end-to-end test that runs it under qemu-user (cli/tests/e2e_arm64.rs).
# The `cross-test` profile (Cargo.toml): release without optimisation, LTO or debug
# info, since the test proves the port, not its speed (packaging/build.sh --arch arm64
# builds the shipped, optimised one). Installs what it needs when missing: the Rust
# target, Debian's cross gcc and arm64 libc, and qemu-user-static.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
scripts/arm64-tools.sh >&2
echo "cross-building weft for $target (profile cross-test)" >&2
cargo build --locked --profile cross-test -p weft --target "$target" >&2
target_dir=${CARGO_TARGET_DIR:-target}
[[ $target_dir = /* ]] || target_dir=$PWD/$target_dir
echo "$target_dir/$target/cross-test/weft"
