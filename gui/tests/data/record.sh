#!/usr/bin/env bash
# Records status.json: the control-socket reply of a real node for the UI tests.
#
#   sudo gui/tests/data/record.sh [path/to/weft]     (default target/debug/weft)
#
# Four nodes in namespaces this script makes and removes: alpha and delta on one
# link to bravo, charlie behind bravo on another, so alpha sees bravo and delta direct,
# charlie through the relay bravo (with a proxied subnet); delta is then killed so it
# shows up as down. The status of alpha is written after some pings.
set -euo pipefail
cd "$(dirname "$0")"
weft=$(realpath "${1:-../../../target/debug/weft}")
tag=wt-rec-$$
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for n in a b c d sw; do ip netns del "$tag-$n" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
for n in a b c d sw; do ip netns add "$tag-$n"; ip -n "$tag-$n" link set lo up; done
# alpha, bravo and delta share a bridge in the switch namespace; bravo-charlie is a veth.
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
i=1
for n in a b d; do
    ip link add eth0 netns "$tag-$n" type veth peer name "p$n" netns "$tag-sw"
    ip -n "$tag-sw" link set "p$n" master br0 up
    ip -n "$tag-$n" addr add "192.0.2.$i/24" dev eth0
    ip -n "$tag-$n" link set eth0 up
    i=$((i + 1))
done
ip link add eth1 netns "$tag-b" type veth peer name eth0 netns "$tag-c"
ip -n "$tag-b" addr add 198.51.100.1/24 dev eth1 && ip -n "$tag-b" link set eth1 up
ip -n "$tag-c" addr add 198.51.100.2/24 dev eth0 && ip -n "$tag-c" link set eth0 up

start() { # ns hostname overlay args...
    local ns=$1 host=$2 ip=$3
    shift 3
    ip netns exec "$tag-$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$host" \
        "$weft" up --network-name lab --network-secret s3cret -i "$ip/24" --threads 2 \
        --state-dir "$dir/$ns" --control "$dir/$ns.sock" "$@" 2>"$dir/$ns.log" &
    pids+=($!)
}
start b bravo 10.126.126.2 -l udp://0.0.0.0:11010
start a alpha 10.126.126.1 -p udp://192.0.2.2:11010
start c charlie 10.126.126.3 -p udp://198.51.100.1:11010 --proxy-network 192.168.77.0/24
start d delta 10.126.126.4 -p udp://192.0.2.2:11010
for _ in $(seq 100); do
    n=$("$weft" status --json --control "$dir/a.sock" 2>/dev/null | grep -o '"state":"established"' | wc -l || true)
    [ "$n" -ge 3 ] && break
    sleep 0.2
done
ip netns exec "$tag-a" ping -q -c 20 -i 0.05 10.126.126.3 >/dev/null
ip netns exec "$tag-a" ping -q -c 20 -i 0.05 -s 1200 10.126.126.2 >/dev/null
kill "${pids[3]}" # delta
for _ in $(seq 150); do
    "$weft" status --json --control "$dir/a.sock" | grep -q '"state":"down"' && break
    sleep 0.2
done
"$weft" status --json --control "$dir/a.sock" >status.json
echo "wrote $(pwd)/status.json"
