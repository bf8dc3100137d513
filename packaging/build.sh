#!/usr/bin/env bash
# Builds the release binaries and the .deb and .rpm of weft and of weft-gui (a package
# of its own, so servers do not pull GUI libraries) into target/packages/.
#
#   packaging/build.sh                 x86-64: weft_*_amd64.deb, weft-*.x86_64.rpm, and weft-gui's
#   packaging/build.sh --arch arm64    (or ARCH=arm64) arm64: weft_*_arm64.deb, weft-*.aarch64.rpm,
#                                      cross-built with Debian's cross gcc, beside the amd64 ones
#
# weft-gui is packaged for amd64 only (its arm64 build is untested: no arm64 desktop here).
# Installs the pinned packaging tools (cargo-deb, cargo-generate-rpm) with
# `cargo install --locked` when they are missing or at another version. Man pages and
# completions come from the binaries themselves (`weft man`, `weft completions`,
# `weft-gui --man`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

arch=${ARCH:-amd64}
while [ $# -gt 0 ]; do
    case $1 in
        --arch) arch=${2:-}; shift 2 || { echo "error: --arch needs a value (amd64 or arm64)" >&2; exit 2; } ;;
        --arch=*) arch=${1#--arch=}; shift ;;
        *) echo "error: unknown argument $1; usage: packaging/build.sh [--arch amd64|arm64]" >&2; exit 2 ;;
    esac
done
case $arch in
    amd64 | x86_64) arch=amd64 triple= ;;
    arm64 | aarch64) arch=arm64 triple=aarch64-unknown-linux-gnu ;;
    *) echo "error: unknown architecture '$arch': packaging/build.sh builds amd64 or arm64" >&2; exit 2 ;;
esac

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1

need_tool() { # cargo-subcommand, crate, version
    local have
    have=$(cargo "$1" --version 2>/dev/null || true)
    if [[ $have != *"$3"* ]]; then
        echo "installing $2 $3"
        # These are build tools, not the product: a light release profile halves the
        # time a fresh CI machine spends compiling them.
        CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
            cargo install --locked --quiet "$2" --version "$3"
    fi
}
need_tool deb cargo-deb "$CARGO_DEB_VERSION"
need_tool generate-rpm cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION"

target_dir=${CARGO_TARGET_DIR:-$root/target}
[[ $target_dir = /* ]] || target_dir=$root/$target_dir
out=$target_dir/packages
mkdir -p "$out"

# The host's weft writes the man pages and completions (the same source as the
# packaged binary, whatever its architecture).
cargo build --release --locked -p weft
weft=$target_dir/release/weft
version=$("$weft" --version)            # weft 0.2.0 (abc1234) protocol 2
pkg_version=$(cargo pkgid -p weft | sed 's/.*[#@]//')
if [ -n "$triple" ]; then
    scripts/arm64-tools.sh
    cargo build --release --locked -p weft --target "$triple"
    release=$target_dir/$triple/release
    strip=aarch64-linux-gnu-strip
    target_args=(--target "$triple")
    rm -f "$out"/weft_*_"$arch".deb "$out"/weft-[0-9]*.aarch64.rpm
else
    cargo build --release --locked -p weft-gui
    release=$target_dir/release
    strip=strip
    target_args=()
    rm -f "$out"/weft[_-]*_amd64.deb "$out"/weft-*.x86_64.rpm
fi
assets=$release/pkg-assets
gui_assets=$release/pkg-assets-gui
rm -rf "$assets" "$gui_assets" && mkdir -p "$assets" "$gui_assets"

packaging/assets.sh weft "$weft" "$release/weft" "$strip" "$assets"
# Debian changelogs for this version, dated by the commit (reproducible).
date=$(git log -1 --format=%cD 2>/dev/null || date -R)
packaging/assets.sh changelog weft "$pkg_version" "$version" "$date" >"$assets/changelog.Debian.gz"

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
cargo deb -p weft --no-build --strip "${target_args[@]}" --output "$out/"
(cd cli && cargo generate-rpm --target-dir "$target_dir" "${target_args[@]}" --output "$out/")
if [ -z "$triple" ]; then
    packaging/assets.sh changelog weft-gui "$pkg_version" "$version" "$date" >"$gui_assets/changelog.Debian.gz"
    "$release/weft-gui" --man | gzip -9n >"$gui_assets/weft-gui.1.gz"
    strip --strip-all -o "$gui_assets/weft-gui" "$release/weft-gui"
    cargo deb -p weft-gui --no-build --strip --output "$out/"
    (cd gui && cargo generate-rpm --target-dir "$target_dir" --output "$out/")
fi
ls -l "$out"/weft*
