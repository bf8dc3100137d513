#!/usr/bin/env bash
# Builds and installs weft, then runs a two-node demo in network namespaces:
# two nodes on a virtual LAN, an encrypted tunnel between them, a ping across it and
# both nodes' status. Everything lives in namespaces this script creates and removes.
# Run as root on Debian 12 with a Rust toolchain (rustup) installed.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (namespaces and TUN devices need CAP_NET_ADMIN)" >&2; exit 2; }
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs first" >&2; exit 2; }
for tool in ip:iproute2 ping:iputils-ping; do
    command -v "${tool%%:*}" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}" >/dev/null
done

cargo build --release --locked -p weft
install -m 0755 target/release/weft /usr/local/bin/weft
echo "installed /usr/local/bin/weft ($(weft --version))"

run=$(mktemp -d /tmp/weft-demo.XXXXXX)
A="weft-demo-a-$$"; B="weft-demo-b-$$"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT INT TERM

ip netns add "$A"; ip netns add "$B"
ip link add eth0 netns "$A" type veth peer name eth0 netns "$B"
ip -n "$A" addr add 198.51.100.1/24 dev eth0; ip -n "$B" addr add 198.51.100.2/24 dev eth0
for ns in "$A" "$B"; do ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up; done

export WEFT_NETWORK_SECRET="demo-secret-$$"
ip netns exec "$A" weft up --network-name demo -i 10.126.126.1/24 \
    --state-dir "$run/a" --control "$run/a.sock" 2>"$run/a.log" & pids+=($!)
ip netns exec "$B" weft up --network-name demo -i 10.126.126.2/24 -p udp://198.51.100.1:11010 \
    --state-dir "$run/b" --control "$run/b.sock" 2>"$run/b.log" & pids+=($!)

for _ in $(seq 50); do
    if weft status --control "$run/b.sock" --json 2>/dev/null | grep -q '"state": "established"'; then break; fi
    sleep 0.2
done
echo; echo "== ping 10.126.126.1 from node B, through the tunnel"
ip netns exec "$B" ping -c 3 -i 0.3 10.126.126.1
echo; echo "== weft status (node A)"; weft status --control "$run/a.sock"
echo; echo "== weft status (node B)"; weft status --control "$run/b.sock"
echo; echo "demo done; namespaces and nodes are removed on exit"
