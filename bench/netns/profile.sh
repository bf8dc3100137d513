#!/usr/bin/env bash
# Where the cycles go: one iperf3 TCP stream B -> A through Weft, per transport, while
# `perf record` samples the whole machine (every CPU, kernel and user, with frame-pointer
# call graphs: DWARF unwinding of a whole machine did not finish processing within the
# runtime limit). Writes per transport a flame graph (inferno), the share of each thread
# (command) and of each symbol, and the throughput of the profiled run.
#
#   A --veth-- B
#
#   sudo bench/netns/profile.sh                          # TRANSPORTS="udp tcp", 8 s
#   sudo TRANSPORTS="quic" DURATION=5 bench/netns/profile.sh
#
# Environment: TRANSPORTS (udp tcp ws wss quic; default "udp tcp"), CIPHER (default
# aes-128-gcm), DURATION (s sampled, default 8), FREQ (samples per second per CPU,
# default 499), WEFT (default target/release/weft, built if missing; the release profile
# keeps line tables for the symbols), OUT (default bench/results/profile), MAX_RUNTIME
# (s; the script stops itself). Needs perf (apt install linux-perf) and inferno (cargo
# install --locked inferno; installed if missing).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-8}
FREQ=${FREQ:-499}
CIPHER=${CIPHER:-aes-128-gcm}
TRANSPORTS=${TRANSPORTS:-udp tcp}
OUT=${OUT:-$ROOT/bench/results/profile}
NT=$(wc -w <<<"$TRANSPORTS")
MAX_RUNTIME=${MAX_RUNTIME:-$((NT * (DURATION * 2 + 120) + 60))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices, perf)" >&2; exit 2; }
for t in ip iperf3 python3 perf; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3 linux-perf)" >&2; exit 2; }
done
for t in $TRANSPORTS; do
    case "$t" in udp|tcp|ws|wss|quic) ;; *) echo "error: transport $t: expected udp, tcp, ws, wss or quic" >&2; exit 2 ;; esac
done
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
if ! command -v inferno-flamegraph >/dev/null; then
    echo "installing inferno (cargo install --locked inferno)" >&2
    cargo install --locked inferno >&2 || { echo "error: cargo install inferno failed" >&2; exit 1; }
fi
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wp$$"
A="$TAG-a"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-profile.XXXXXX)
PIDS=()
WEFTS=()
stop_wefts() {
    for pid in "${WEFTS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${WEFTS[@]}"; do wait "$pid" 2>/dev/null || true; done
    WEFTS=()
}
cleanup() {
    stop_wefts
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "$A" "$B"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
. "$HERE/procs.sh"
start_watchdog   # its sleep goes with it: a leftover one held a caller's pipe open
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$B"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$TAG-ab" netns "$A" type veth peer name "$TAG-ba" netns "$B"
nsx "$A" ip addr add 192.0.2.1/24 dev "$TAG-ab"; nsx "$A" ip link set "$TAG-ab" up
nsx "$B" ip addr add 192.0.2.2/24 dev "$TAG-ba"; nsx "$B" ip link set "$TAG-ba" up

nsx "$A" iperf3 -s -D --pidfile "$WORK/iperf3.pid" >/dev/null
sleep 0.5
PIDS+=("$(cat "$WORK/iperf3.pid")")

NET=(--network-name bench --network-secret "profile bench secret" --cipher "$CIPHER" --no-ipv6)
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >>"$WORK/$name.log" 2>&1 &
    WEFTS+=("$!")
}
uri() { # transport host
    case "$1" in udp|tcp) echo "$1://$2:11010" ;; ws) echo "ws://$2:11011/" ;; wss) echo "wss://$2:11012/" ;; quic) echo "quic://$2:11013" ;; esac
}
peer_path() { # sock overlay -> "path transport"
    "$WEFT" peers --json --control "$1" 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
for p in (d['peers'] if isinstance(d, dict) else d):
    if p['overlay'] == sys.argv[1]:
        print(p['path'], p['transport'])" "$2"
}

mkdir -p "$OUT"
SUMMARY="$WORK/summary.md"
: >"$SUMMARY"
for t in $TRANSPORTS; do
    start_weft "$A" a -i 10.126.200.1/24 -l "$(uri "$t" 0.0.0.0)"
    sleep 0.3
    start_weft "$B" b -i 10.126.200.2/24 -l "$(uri "$t" 0.0.0.0)" -p "$(uri "$t" 192.0.2.1)"
    ok=0
    for _ in $(seq 150); do
        if nsx "$B" ping -c 1 -W 1 10.126.200.1 >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.2
    done
    [ "$ok" = 1 ] || { echo "error: B never reached A over $t" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
    path=$(peer_path "$WORK/b.sock" 10.126.200.1)
    [ "$path" = "direct $t" ] || { echo "error: B -> A is not direct over $t ($path)" >&2; exit 1; }
    # The stream runs two seconds longer than the sampling, which starts after one.
    nsx "$B" iperf3 -c 10.126.200.1 -t $((DURATION + 2)) -J >"$WORK/iperf-$t.json" 2>/dev/null &
    client=$!
    sleep 1
    perf record -q -a -F "$FREQ" -g -o "$WORK/perf-$t.data" -- sleep "$DURATION" \
        >/dev/null 2>"$WORK/perf-$t.err" || { cat "$WORK/perf-$t.err" >&2; exit 1; }
    wait "$client" || true
    stop_wefts
    rm -rf "$WORK"/{a,b}-state
    gbps=$(python3 -c "import json,sys; print(f\"{json.load(open(sys.argv[1]))['end']['sum_received']['bits_per_second']/1e9:.2f}\")" \
        "$WORK/iperf-$t.json" 2>/dev/null || echo failed)
    echo "$t: $gbps Gbit/s while profiled; processing the samples" >&2
    perf script -i "$WORK/perf-$t.data" 2>/dev/null | inferno-collapse-perf --all >"$WORK/folded-$t.txt"
    inferno-flamegraph --title "weft $CIPHER over $t, iperf3 B->A, whole machine ($gbps Gbit/s)" \
        <"$WORK/folded-$t.txt" >"$OUT/flame-$t.svg"
    perf report -i "$WORK/perf-$t.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -v '^$' >"$OUT/comm-$t.txt" || true
    perf report -i "$WORK/perf-$t.data" --no-children --sort comm,dso,sym --stdio -g none --percent-limit 0.5 2>/dev/null \
        | grep -v '^$' >"$OUT/symbols-$t.txt" || true
    {
        echo "## $t ($CIPHER): $gbps Gbit/s while profiled"
        echo
        echo '```'
        grep -v '^#' "$OUT/comm-$t.txt" | head -12
        echo
        grep -v '^#' "$OUT/symbols-$t.txt" | head -30
        echo '```'
        echo
    } >>"$SUMMARY"
done

{
    info=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
    echo "# Profiles: where the cycles go"
    echo
    echo "Date $(date -u +%Y-%m-%d), $info, $(nproc) cores, kernel $(uname -r), $("$WEFT" --version)."
    echo "Command: \`sudo TRANSPORTS=\"$TRANSPORTS\" CIPHER=$CIPHER DURATION=$DURATION FREQ=$FREQ bench/netns/profile.sh\`;"
    echo "one iperf3 TCP stream B -> A, default settings (two pipelines), the whole machine sampled"
    echo "(perf record -a -g). Flame graphs: flame-<transport>.svg."
    echo
    cat "$SUMMARY"
} >"$OUT/results.md"
cat "$OUT/results.md"
