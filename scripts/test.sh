#!/usr/bin/env bash
# The whole test suite: unit, sans-IO, and end-to-end tests in network namespaces.
# Run as root on Debian 12: it installs the few tools the e2e tests drive (ip, ping,
# tcpdump, setpriv, unshare, Xvfb for weft-gui) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "error: the end-to-end tests create network namespaces and TUN devices; run as root" >&2
    exit 2
fi
need=()
# wireguard-go and wg: the WireGuard portal's test uses them as the stock client;
# dig: the Magic DNS test asks with it; miniupnpd: the port-mapping test's router;
# chromium and its WebDriver: the web console's browser test.
for tool in ip:iproute2 ping:iputils-ping tcpdump:tcpdump setpriv:util-linux unshare:util-linux nft:nftables iperf3:iperf3 sysctl:procps Xvfb:xvfb wireguard-go:wireguard-go wg:wireguard-tools dig:bind9-dnsutils miniupnpd:miniupnpd-nftables chromium:chromium chromedriver:chromium-driver; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# promtool (Debian's prometheus package) checks the metrics in cli/tests/e2e_metrics.rs:
# taken out of the package, not installed, so no Prometheus server starts here.
if [ -z "${PROMTOOL:-}" ]; then
    if command -v promtool >/dev/null 2>&1; then
        PROMTOOL=$(command -v promtool)
    else
        PROMTOOL=$PWD/target/promtool/usr/bin/promtool
        if [ ! -x "$PROMTOOL" ]; then
            echo "fetching promtool (from Debian's prometheus package)"
            tmp=$(mktemp -d)
            (cd "$tmp" && apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; })
            mkdir -p target/promtool
            dpkg-deb -x "$tmp"/prometheus_*.deb target/promtool
            rm -rf "$tmp"
        fi
    fi
fi
export PROMTOOL
# The previous release's weft for the mixed-version tests (cli/tests/e2e_mixed.rs):
# built once per commit named in packaging/previous-release, then cached.
if [ -z "${WEFT_PREVIOUS:-}" ]; then
    WEFT_PREVIOUS=$(scripts/build-previous.sh)
fi
export WEFT_PREVIOUS
# An arm64 weft for the test that runs it under qemu-user (cli/tests/e2e_arm64.rs).
if [ -z "${WEFT_ARM64:-}" ]; then
    WEFT_ARM64=$(scripts/build-arm64.sh)
fi
export WEFT_ARM64
# Everything is built first (one cargo at a time holds the build directory while it
# compiles); the tests then run in two lanes at once. The end-to-end suites mostly
# wait (on timers, handshakes and the network in their own namespaces), so two of
# them side by side keep both cores busy and the suite takes about half as long.
# Every cargo below selects the whole workspace (and its targets by name), so that
# features resolve as in this build and no lane rebuilds what the other one reads.
# --include-ignored: the 200-node simulation is part of the suite.
cargo test --workspace --locked --no-run "$@"
# Test targets are the crates' tests/*.rs files. Lane 1: the unit tests, every
# integration test but the end-to-end ones, half of those, then the doc tests. Lane
# 2: the other half, then the data path's suites once more with every offload off
# (TUN TSO/GRO, UDP GSO/GRO).
one=() two=()
i=0
for f in */tests/*.rs; do
    t=${f##*/}
    t=${t%.rs}
    case $t in
        e2e_*)
            if ((i % 2 == 0)); then one+=(--test "$t"); else two+=(--test "$t"); fi
            i=$((i + 1))
            ;;
        *) one+=(--test "$t") ;;
    esac
done
lane1() {
    cargo test --workspace --locked --lib --bins "${one[@]}" "$@" -- --include-ignored &&
        cargo test --workspace --locked --doc "$@"
}
lane2() {
    cargo test --workspace --locked "${two[@]}" "$@" -- --include-ignored &&
        WEFT_NO_OFFLOAD=1 cargo test --workspace --locked --test e2e_tunnel --test e2e_mesh --test e2e_transports "$@"
}
# Each line says its lane; a lane's status is its first failure.
(set -o pipefail; lane1 "$@" 2>&1 | sed -u 's/^/[1] /') &
pid1=$!
(set -o pipefail; lane2 "$@" 2>&1 | sed -u 's/^/[2] /') &
pid2=$!
rc=0
wait "$pid1" || rc=$?
wait "$pid2" || rc=$((rc ? rc : $?))
if [ "$rc" -ne 0 ]; then
    echo "test.sh: a test lane failed (exit $rc): look for FAILED and 'panicked' above, lines [1] and [2]" >&2
fi
exit "$rc"
