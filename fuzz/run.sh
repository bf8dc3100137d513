#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for SECONDS each, one after the
# other, and prints per target the executions and crashes libFuzzer reports.
#
#   fuzz/run.sh SECONDS [--merge] [TARGET...]
#
# New corpus entries go to a temporary directory, so the kept corpus (fuzz/corpus/,
# replayed on stable by `cargo test -p weft-fuzz`) does not grow; --merge adds the
# new inputs that reach new coverage to it (libFuzzer -merge=1). Crashing inputs are
# written to fuzz/artifacts/TARGET/. Exit status: 0 when nothing crashed, 1 when a
# target crashed (or failed to run), 3 when nightly or cargo-fuzz is missing.
set -uo pipefail
cd "$(dirname "$0")"

usage() { echo "usage: fuzz/run.sh SECONDS [--merge] [TARGET...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
secs=$1
shift
[[ $secs =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || usage
merge=0
targets=()
for a in "$@"; do
    case $a in
        --merge) merge=1 ;;
        -*) usage ;;
        *) targets+=("$a") ;;
    esac
done

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "fuzz/run.sh: the nightly Rust toolchain is missing, so libFuzzer targets cannot be built." >&2
    echo "  install it with: rustup toolchain install nightly" >&2
    echo "  the kept corpus is still replayed on stable by: cargo test -p weft-fuzz" >&2
    exit 3
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: cargo-fuzz is missing: cargo install cargo-fuzz --version 0.13.2 --locked" >&2
    exit 3
fi
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

echo "building ${#targets[@]} targets (nightly, libFuzzer)"
if ! build_log=$(cargo +nightly fuzz build 2>&1); then
    echo "$build_log" >&2
    exit 1
fi

# Runs target $1 with libFuzzer arguments $2...: the binary `cargo fuzz build` just made,
# with the sanitizer options `cargo fuzz run` gives it (which would first check the
# build again, seconds per target); `cargo fuzz run` when the binary is elsewhere.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"
bin_dir="${CARGO_TARGET_DIR:-target}/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
fuzz() {
    local t=$1
    shift
    if [ -x "$bin_dir/$t" ]; then
        "$bin_dir/$t" "$@"
    else
        cargo +nightly fuzz run "$t" -- "$@"
    fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
total_execs=0
printf '%-18s %14s %8s %8s\n' target executions crashes seconds
for t in "${targets[@]}"; do
    mkdir -p "$work/$t" "corpus/$t" "artifacts/$t"
    log="$work/$t.log"
    start=$(date +%s)
    fuzz "$t" "$work/$t" "corpus/$t" \
        -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="artifacts/$t/" >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    [ -n "$execs" ] || execs=$(grep -o '^Done [0-9]* runs' "$log" | tail -1 | grep -o '[0-9][0-9]*')
    [ -n "$execs" ] || execs=0
    crashes=$(grep -c 'Test unit written to' "$log")
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes="error"
    fi
    printf '%-18s %14s %8s %8s\n' "$t" "$execs" "$crashes" "$took"
    total_execs=$((total_execs + execs))
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "---- $t failed (exit $rc); last lines of its log:" >&2
        tail -40 "$log" >&2
    elif [ "$merge" -eq 1 ]; then
        fuzz "$t" -merge=1 "corpus/$t" "$work/$t" >"$work/$t.merge" 2>&1 \
            || { echo "merge into corpus/$t failed" >&2; failed=1; }
    fi
done
echo "total executions: $total_execs"
exit "$failed"
