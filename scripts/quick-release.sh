#!/usr/bin/env bash
# Runs a command (a cargo build, or a script that runs one) with the quick release
# settings: the release profile without optimisation, LTO or debug info, in a target
# directory of its own (target/quick). The builds that prove compatibility, not speed,
# use it: the previous release (scripts/build-previous.sh), the arm64 binary the qemu
# test runs (scripts/build-arm64.sh) and CI's package test (.ci/run). Sharing the
# settings and the directory lets them share the compiled dependency tree: on a clean
# clone it is compiled once per architecture instead of once per script (the previous
# release only when its version differs from this tree's: scripts/build-previous.sh).
#
#   scripts/quick-release.sh cargo build --release -p weft
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "error: scripts/quick-release.sh needs a command to run (e.g. cargo build --release)" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=0
export CARGO_TARGET_DIR=${QUICK_TARGET_DIR:-$root/target/quick}
exec "$@"
