#!/usr/bin/env bash
# The generated files the weft packages ship, for packaging/build.sh and for
# scripts/build-previous.sh --packages (the previous release's packages, made with
# that release's binary and package metadata).
#
#   packaging/assets.sh weft HOST_WEFT PACKAGED_WEFT STRIP DIR
#       man pages and shell completions (written by HOST_WEFT, a weft this machine
#       runs, of the same source as PACKAGED_WEFT) and PACKAGED_WEFT stripped by STRIP,
#       into DIR/man, DIR/completions and DIR/weft
#   packaging/assets.sh changelog PACKAGE PKG_VERSION "VERSION LINE" DATE
#       a Debian changelog entry, gzipped, on stdout (reproducible: dated by the commit)
set -euo pipefail
case "${1:-}" in
    weft)
        [ $# -eq 5 ] || { echo "usage: packaging/assets.sh weft HOST_WEFT PACKAGED_WEFT STRIP DIR" >&2; exit 2; }
        weft=$2 packaged=$3 strip=$4 dir=$5
        mkdir -p "$dir/man" "$dir/completions"
        # Man pages: weft(1) and one per visible subcommand (those `weft --help` lists).
        "$weft" man | gzip -9n >"$dir/man/weft.1.gz"
        for cmd in $("$weft" --help | sed -n '/^Commands:/,/^$/p' | grep -oE '^  [a-z][a-z0-9-]*' | grep -vx '  help'); do
            "$weft" man "$cmd" | gzip -9n >"$dir/man/weft-$cmd.1.gz"
        done
        "$weft" completions bash >"$dir/completions/weft"
        "$weft" completions zsh >"$dir/completions/_weft"
        "$weft" completions fish >"$dir/completions/weft.fish"
        "$strip" --strip-all -o "$dir/weft" "$packaged"
        ;;
    changelog)
        [ $# -eq 5 ] || { echo "usage: packaging/assets.sh changelog PACKAGE PKG_VERSION VERSION_LINE DATE" >&2; exit 2; }
        {
            echo "$2 ($3-1) unstable; urgency=medium"
            echo
            echo "  * Built from $4."
            echo
            echo " -- The Weft developers <weft@example.invalid>  $5"
        } | gzip -9n
        ;;
    *)
        echo "usage: packaging/assets.sh weft|changelog ..." >&2
        exit 2
        ;;
esac
