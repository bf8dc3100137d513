#!/usr/bin/env bash
# Builds the previous release's `weft` (the commit named in packaging/previous-release)
# in a git worktree, release profile, and prints the binary's path. Cached by commit
# under target/previous/COMMIT/weft: a second call prints the path at once.
#
# These binaries prove compatibility, not speed: built with scripts/quick-release.sh
# (no optimisation, LTO or debug info), sharing its compiled dependencies with the
# arm64 test build and CI's package test.
#
#   scripts/build-previous.sh              prints the binary's path
#   scripts/build-previous.sh --packages   also makes that release's .deb and .rpm (its
#                                          package metadata and maintainer scripts, its
#                                          binary) for the upgrade test in packaging/test.sh,
#                                          cached in target/previous/COMMIT/packages/, and
#                                          prints that directory (needs cargo-deb and
#                                          cargo-generate-rpm: packaging/build.sh installs them)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
packages=no
case "${1:-}" in
    "") ;;
    --packages) packages=yes ;;
    *) echo "error: unknown argument $1; usage: scripts/build-previous.sh [--packages]" >&2; exit 2 ;;
esac

commit=$(tr -d '[:space:]' <packaging/previous-release)
if ! [[ $commit =~ ^[0-9a-f]{40}$ ]]; then
    echo "error: packaging/previous-release must hold one full commit hash, not ${commit:-nothing}" >&2
    exit 2
fi
out=$root/target/previous/$commit
bin=$out/weft
pkgs=$out/packages
if [ -x "$bin" ] && { [ $packages = no ] || compgen -G "$pkgs/weft_*.deb" >/dev/null; }; then
    if [ $packages = yes ]; then echo "$pkgs"; else echo "$bin"; fi
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

if [ ! -x "$bin" ]; then
    echo "building the previous release ($commit) for the mixed-version tests" >&2
    # Cargo names a workspace crate's build by name, version and path inside its
    # workspace, not by where the workspace is: in a shared target directory, the
    # previous release's weft-core would stand for this tree's if both had one
    # version (and sources no newer than its build). Only a release whose version
    # differs from this tree's shares target/quick; another builds apart.
    old_version=$(cargo pkgid -p weft --manifest-path "$tree/Cargo.toml" | sed 's/.*[#@]//')
    new_version=$(cargo pkgid -p weft | sed 's/.*[#@]//')
    quick_dir=${QUICK_TARGET_DIR:-$root/target/quick}
    [ "$old_version" != "$new_version" ] || quick_dir=$out/target
    QUICK_TARGET_DIR=$quick_dir scripts/quick-release.sh \
        cargo build --release --locked -p weft --manifest-path "$tree/Cargo.toml" >&2
    # The next quick build of this tree's weft overwrites it: keep a copy.
    cp "$quick_dir/release/weft" "$bin.tmp"
    mv "$bin.tmp" "$bin"
    [ "$quick_dir" != "$out/target" ] || rm -rf "$out/target"
fi
if [ $packages = no ]; then
    echo "$bin"
    exit 0
fi

for tool in deb generate-rpm; do
    if ! cargo "$tool" --version >/dev/null 2>&1; then
        echo "error: cargo $tool is missing: packaging/build.sh installs the packaging tools" >&2
        exit 1
    fi
done
echo "packaging the previous release ($commit)" >&2
# The previous release's package metadata (cli/Cargo.toml) names its assets under
# target/release/: a target directory of their own, holding the cached binary.
pkg_target=$out/pkg-target
rm -rf "$pkg_target" "$pkgs.tmp" && mkdir -p "$pkg_target/release" "$pkgs.tmp"
cp "$bin" "$pkg_target/release/weft"
packaging/assets.sh weft "$bin" "$bin" strip "$pkg_target/release/pkg-assets" >&2
pkg_version=$(cargo pkgid -p weft --manifest-path "$tree/Cargo.toml" | sed 's/.*[#@]//')
packaging/assets.sh changelog weft "$pkg_version" "$("$bin" --version)" "$(git log -1 --format=%cD "$commit")" \
    >"$pkg_target/release/pkg-assets/changelog.Debian.gz"
export SOURCE_DATE_EPOCH=$(git log -1 --format=%ct "$commit")
(cd "$tree" && CARGO_TARGET_DIR="$pkg_target" cargo deb -p weft --no-build --strip --output "$pkgs.tmp/") >&2
(cd "$tree/cli" && cargo generate-rpm --target-dir "$pkg_target" --output "$pkgs.tmp/") >&2
rm -rf "$pkgs" "$pkg_target"
mv "$pkgs.tmp" "$pkgs"
echo "$pkgs"
