#!/usr/bin/env bash
# An MTU black hole appearing under a running transfer: one TCP stream (iperf3, 1-s
# intervals) from A to B through Weft, across router R; HOLE_AT seconds in, R's links
# drop to LIMIT bytes (default 1280) and R sends no ICMP. Reports, per repetition, the
# stream's speed before, its steady speed after (the median of the last 8 intervals),
# and the time from the black hole to the first second at 90 % of that steady speed.
#
#   sudo bench/netns/blackhole.sh                  # REPS=3 DURATION=30 HOLE_AT=8 LIMIT=1280
#
# Environment: WEFT (default target/release/weft, built if missing), REPS, DURATION,
# HOLE_AT, LIMIT, MAX_RUNTIME (s; the script stops itself, default REPS × (DURATION + 30)).
# Everything lives in three namespaces made here and removed on exit; none has a route
# out of them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
REPS=${REPS:-3}
DURATION=${DURATION:-30}
HOLE_AT=${HOLE_AT:-8}
LIMIT=${LIMIT:-1280}
MAX_RUNTIME=${MAX_RUNTIME:-$((REPS * (DURATION + 30)))}
for t in ip iperf3 python3 nft; do
    command -v "$t" >/dev/null || { echo "error: $t missing" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="bh$$"
A="$TAG-a"; R="$TAG-r"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-blackhole.XXXXXX)
PIDS=()
WEFTS=()
IN_CLEANUP=0
. "$HERE/procs.sh"
cleanup() {
    IN_CLEANUP=1
    for p in "${WEFTS[@]}" "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for ns in "$A" "$R" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
install_traps
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$R" "$B"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add a0 netns "$A" type veth peer name ra netns "$R"
ip link add b0 netns "$B" type veth peer name rb netns "$R"
nsx "$A" ip addr add 192.0.2.1/24 dev a0; nsx "$A" ip link set a0 up
nsx "$B" ip addr add 198.51.100.2/24 dev b0; nsx "$B" ip link set b0 up
nsx "$R" ip addr add 192.0.2.254/24 dev ra; nsx "$R" ip link set ra up
nsx "$R" ip addr add 198.51.100.254/24 dev rb; nsx "$R" ip link set rb up
nsx "$A" ip route add 198.51.100.0/24 via 192.0.2.254
nsx "$B" ip route add 192.0.2.0/24 via 198.51.100.254
nsx "$R" sysctl -qw net.ipv4.ip_forward=1
# The router never says "fragmentation needed": a black hole.
nsx "$R" nft add table inet bh
nsx "$R" nft add chain inet bh out '{ type filter hook output priority 0; }'
nsx "$R" nft add rule inet bh out meta l4proto icmp drop

NET=(--network-name bh --network-secret "black hole bench secret")
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >>"$WORK/$name.log" 2>&1 &
    WEFTS+=("$!")
}
nsx "$B" iperf3 -s -D --pidfile "$WORK/iperf3.pid" >/dev/null
sleep 0.5
PIDS+=("$(cat "$WORK/iperf3.pid")")
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
for rep in $(seq "$REPS"); do
    for dev in ra rb; do nsx "$R" ip link set "$dev" mtu 1500; done
    start_weft "$B" b -i 10.126.190.2/24 -l udp://0.0.0.0:11010
    sleep 0.3
    start_weft "$A" a -i 10.126.190.1/24 -p udp://198.51.100.2:11010
    for _ in $(seq 100); do nsx "$A" ping -c 1 -W 1 10.126.190.2 >/dev/null 2>&1 && break; sleep 0.2; done
    sleep 3   # the first path MTU search (the full size passes)
    nsx "$A" iperf3 -c 10.126.190.2 -t "$DURATION" -i 1 -J >"$WORK/iperf-$rep.json" 2>/dev/null &
    client=$!
    sleep "$HOLE_AT"
    for dev in ra rb; do nsx "$R" ip link set "$dev" mtu "$LIMIT"; done
    wait "$client" || true
    python3 - "$WORK/iperf-$rep.json" "$HOLE_AT" "$rep" >>"$RUNS" <<'PY'
import json, statistics, sys
path, hole, rep = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
try:
    iv = [(i["sum"]["end"], i["sum"]["bits_per_second"] / 1e9) for i in json.load(open(path))["intervals"]]
except Exception as e:
    print(json.dumps({"rep": rep, "error": str(e)})); sys.exit(0)
before = statistics.median([g for t, g in iv if 2 <= t <= hole])
after = statistics.median([g for _, g in iv[-8:]])
first = next((t for t, g in iv if t > hole + 1 and g >= 0.9 * after), None)
print(json.dumps({"rep": rep, "before_gbps": before, "after_gbps": after,
                  "first_full_s": None if first is None else first - hole}))
PY
    tail -1 "$RUNS" >&2
    stop_all WEFTS
    rm -rf "$WORK"/{a,b}-state
done
python3 - "$RUNS" "$LIMIT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r for r in runs if r.get("first_full_s") is not None]
print(f"black hole at {sys.argv[2]} bytes, {len(runs)} runs: "
      f"first second at 90 % of the new steady speed {[round(r['first_full_s'], 1) for r in ok]} s after it "
      f"(median {statistics.median([r['first_full_s'] for r in ok]) if ok else 'none'}); "
      f"speed before {[round(r['before_gbps'], 2) for r in ok]}, after {[round(r['after_gbps'], 2) for r in ok]} Gbit/s")
PY
