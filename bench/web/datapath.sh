#!/usr/bin/env bash
# The data path while a browser watches: one TCP stream (iperf3) from A to B through
# Weft, alone and with the web console open on A (`weft web` on A's control socket,
# its event stream held open and the status fetched every 2 s, as the console's pages
# do), in alternation, REPS times each. Reports each run and the medians, and the
# watched median as a ratio of the unwatched one taken in the same run.
#
#   sudo bench/web/datapath.sh               # REPS=5 DURATION=10
#
# Environment: WEFT (default target/release/weft, built if missing), REPS, DURATION,
# MAX_RUNTIME (s; the script stops itself, default REPS × 2 × (DURATION + 15)).
# Everything lives in two namespaces made here and removed on exit; neither has a
# route out of them (the console listens on A's own loopback).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
REPS=${REPS:-5}
DURATION=${DURATION:-10}
MAX_RUNTIME=${MAX_RUNTIME:-$((REPS * 2 * (DURATION + 15)))}
for v in REPS DURATION MAX_RUNTIME; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for t in ip iperf3 python3 curl; do
    command -v "$t" >/dev/null || { echo "error: $t missing" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wd$$"
A="$TAG-a"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-webdp.XXXXXX)
PIDS=()
WEFTS=()
IN_CLEANUP=0
. "$ROOT/bench/netns/procs.sh"
cleanup() {
    IN_CLEANUP=1
    for p in "${WEFTS[@]}" "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for ns in "$A" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
install_traps
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$B"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add a0 netns "$A" type veth peer name b0 netns "$B"
nsx "$A" ip addr add 192.0.2.1/24 dev a0; nsx "$A" ip link set a0 up
nsx "$B" ip addr add 192.0.2.2/24 dev b0; nsx "$B" ip link set b0 up

NET=(--network-name webdp --network-secret "web console bench secret")
# Background processes are started by `ip netns exec` itself (it becomes the command),
# so that $! is their PID and cleanup stops them.
ip netns exec "$B" "$WEFT" up "${NET[@]}" --state-dir "$WORK/b-state" --control "$WORK/b.sock" \
    -i 10.126.191.2/24 -l udp://0.0.0.0:11010 >>"$WORK/b.log" 2>&1 &
WEFTS+=("$!")
sleep 0.3
ip netns exec "$A" "$WEFT" up "${NET[@]}" --state-dir "$WORK/a-state" --control "$WORK/a.sock" \
    -i 10.126.191.1/24 -p udp://192.0.2.2:11010 >>"$WORK/a.log" 2>&1 &
WEFTS+=("$!")
for _ in $(seq 100); do nsx "$A" ping -c 1 -W 1 10.126.191.2 >/dev/null 2>&1 && break; sleep 0.2; done
nsx "$B" iperf3 -s -D --pidfile "$WORK/iperf3.pid" >/dev/null
sleep 0.5
PIDS+=("$(cat "$WORK/iperf3.pid")")

# The console on A with one page open: the event stream and a status fetch every 2 s.
watch_start() {
    ip netns exec "$A" "$WEFT" web --listen 127.0.0.1:0 --control "$WORK/a.sock" >"$WORK/url" 2>"$WORK/web.log" &
    WEB=$!
    PIDS+=("$WEB")
    for _ in $(seq 50); do [ -s "$WORK/url" ] && break; sleep 0.1; done
    local url base
    url=$(head -1 "$WORK/url")
    base=${url%%/\?*}
    nsx "$A" curl -s -o /dev/null -c "$WORK/jar" "$url"
    ip netns exec "$A" curl -s -N -b "$WORK/jar" "$base/api/events" >"$WORK/events" &
    SSE=$!
    PIDS+=("$SSE")
    (while true; do ip netns exec "$A" curl -s -o /dev/null -b "$WORK/jar" "$base/api/status"; sleep 2; done) </dev/null >/dev/null 2>&1 &
    POLL=$!
    PIDS+=("$POLL")
}
watch_stop() {
    kill "$POLL" "$SSE" "$WEB" 2>/dev/null || true
    wait "$POLL" "$SSE" "$WEB" 2>/dev/null || true
    EVENTS=$(grep -c '^event: traffic' "$WORK/events" || true)
}

RUNS="$WORK/runs.jsonl"
: >"$RUNS"
for rep in $(seq "$REPS"); do
    for mode in alone watched; do
        EVENTS=0
        [ "$mode" = watched ] && watch_start && sleep 1
        nsx "$A" iperf3 -c 10.126.191.2 -t "$DURATION" -J >"$WORK/iperf.json" 2>/dev/null || true
        [ "$mode" = watched ] && watch_stop
        python3 - "$WORK/iperf.json" "$mode" "$rep" "$EVENTS" >>"$RUNS" <<'PY'
import json, sys
path, mode, rep, events = sys.argv[1:]
try:
    bps = json.load(open(path))["end"]["sum_received"]["bits_per_second"]
except Exception:
    bps = 0.0
print(json.dumps({"rep": int(rep), "mode": mode, "gbps": bps / 1e9, "events": int(events)}))
PY
        tail -1 "$RUNS"
    done
done
python3 - "$RUNS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = {m: statistics.median(r["gbps"] for r in runs if r["mode"] == m) for m in ("alone", "watched")}
ev = [r["events"] for r in runs if r["mode"] == "watched"]
print(f"median alone {med['alone']:.2f} Gbit/s, watched {med['watched']:.2f} Gbit/s, "
      f"ratio {med['watched'] / med['alone']:.3f}; events received per watched run {ev}")
if min(ev, default=0) == 0:
    print("error: a watched run received no event: the console was not watching", file=sys.stderr)
    sys.exit(1)
PY
