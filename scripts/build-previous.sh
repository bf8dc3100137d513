#!/usr/bin/env bash
# Builds the previous release's `weft` (the commit named in packaging/previous-release)
# in a git worktree, release profile, and prints the binary's path. Cached by commit
# under target/previous/COMMIT/weft: a second call prints the path at once.
#
# These binaries prove compatibility, not speed: the release profile is built without
# LTO, with more codegen units and no debug info, to keep the build short.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

commit=$(tr -d '[:space:]' <packaging/previous-release)
if ! [[ $commit =~ ^[0-9a-f]{40}$ ]]; then
    echo "error: packaging/previous-release must hold one full commit hash, not ${commit:-nothing}" >&2
    exit 2
fi
out=$root/target/previous/$commit
bin=$out/weft
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    echo "shallow clone: fetching its history for $commit" >&2
    git fetch --quiet --unshallow >&2 || true
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "error: commit $commit (packaging/previous-release) is not in this clone's history; fetch it" >&2
    exit 1
fi

mkdir -p "$out"
tree=$out/src
git worktree prune
rm -rf "$tree"
git worktree add --detach --force "$tree" "$commit" >&2
cleanup() { git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT

echo "building the previous release ($commit) for the mixed-version tests" >&2
CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_TARGET_DIR="$out/target" cargo build --release --locked -p weft --manifest-path "$tree/Cargo.toml" >&2
cp "$out/target/release/weft" "$bin.tmp"
mv "$bin.tmp" "$bin"
# Only the binary is kept: the build tree is large and never reused.
rm -rf "$out/target"
echo "$bin"
