#!/usr/bin/env bash
# Builds the release binaries and the .deb and .rpm of weft and of weft-gui (a package
# of its own, so servers do not pull GUI libraries) into target/packages/.
#
#   packaging/build.sh
#
# Installs the pinned packaging tools (cargo-deb, cargo-generate-rpm) with
# `cargo install --locked` when they are missing or at another version. Man pages and
# completions come from the binaries themselves (`weft man`, `weft completions`,
# `weft-gui --man`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

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
release=$target_dir/release
assets=$release/pkg-assets
out=$target_dir/packages

cargo build --release --locked -p weft -p weft-gui
weft=$release/weft
version=$("$weft" --version)            # weft 0.1.0 (abc1234)
pkg_version=$(cargo pkgid -p weft | sed 's/.*[#@]//')

gui_assets=$release/pkg-assets-gui
rm -rf "$assets" "$gui_assets" && mkdir -p "$assets/man" "$assets/completions" "$gui_assets" "$out"
rm -f "$out"/weft[_-]*.deb "$out"/weft-*.rpm

# Man pages: weft(1) and one per visible subcommand (those `weft --help` lists).
"$weft" man | gzip -9n >"$assets/man/weft.1.gz"
for cmd in $("$weft" --help | sed -n '/^Commands:/,/^$/p' | grep -oE '^  [a-z][a-z0-9-]*' | grep -vx '  help'); do
    "$weft" man "$cmd" | gzip -9n >"$assets/man/weft-$cmd.1.gz"
done
"$weft" completions bash >"$assets/completions/weft"
"$weft" completions zsh >"$assets/completions/_weft"
"$weft" completions fish >"$assets/completions/weft.fish"
strip --strip-all -o "$assets/weft" "$weft"

# Debian changelogs for this version, dated by the commit (reproducible).
date=$(git log -1 --format=%cD 2>/dev/null || date -R)
changelog() { # package
    echo "$1 ($pkg_version-1) unstable; urgency=medium"
    echo
    echo "  * Built from $version."
    echo
    echo " -- The Weft developers <weft@example.invalid>  $date"
}
changelog weft | gzip -9n >"$assets/changelog.Debian.gz"
changelog weft-gui | gzip -9n >"$gui_assets/changelog.Debian.gz"

"$release/weft-gui" --man | gzip -9n >"$gui_assets/weft-gui.1.gz"
strip --strip-all -o "$gui_assets/weft-gui" "$release/weft-gui"

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
cargo deb -p weft --no-build --strip --output "$out/"
(cd cli && cargo generate-rpm --target-dir "$target_dir" --output "$out/")
cargo deb -p weft-gui --no-build --strip --output "$out/"
(cd gui && cargo generate-rpm --target-dir "$target_dir" --output "$out/")
ls -l "$out"/weft*
