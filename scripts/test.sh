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
# --include-ignored: the 200-node simulation is part of the suite.
cargo test --workspace --locked --no-run "$@"
e2e=()
for f in cli/tests/e2e_*.rs; do
    f=${f##*/}
    e2e+=("${f%.rs}")
done
one=() two=()
for i in "${!e2e[@]}"; do
    if ((i % 2 == 0)); then one+=(--test "${e2e[$i]}"); else two+=(--test "${e2e[$i]}"); fi
done
# Lane 1: every crate but weft, and half of weft's end-to-end suites. Lane 2: weft's
# unit and command-line tests, the other half, then the data path's suites once more
# with every offload off (TUN TSO/GRO, UDP GSO/GRO).
lane1() {
    cargo test --workspace --exclude weft --locked "$@" -- --include-ignored &&
        cargo test -p weft --locked "${one[@]}" "$@" -- --include-ignored
}
lane2() {
    cargo test -p weft --locked --lib --bins --test 'cli_*' "${two[@]}" "$@" -- --include-ignored &&
        WEFT_NO_OFFLOAD=1 cargo test --locked -p weft --test e2e_tunnel --test e2e_mesh --test e2e_transports "$@"
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
