#!/usr/bin/env bash
# What an idle hop costs in the socket layer alone: round trips of one 100-byte
# datagram between two namespaces on a veth pair (no tunnel, no TUN), on plain
# unconnected sockets, connected sockets (boringtun's per-peer sockets) and Weft's own
# (a reuseport group with the sparse-flow steering program, UDP GRO, timestamps,
# recvmmsg/sendmmsg), interleaved ROUNDS times (bench/RESULTS.md §50). Two more modes
# take Weft's sockets apart: weft-1 (one socket: no steering program) and weft-nogro
# (no UDP GRO).
#
#   sudo bench/netns/udprtt.sh                   # ROUNDS=5, COUNT=500 per mode and round
#
# Environment: ROUNDS (default 5), COUNT (round trips per mode and round, 10 ms apart;
# default 500), MODES (default "plain connected weft"), UDPRTT (binary; default
# target/release/udprtt, built if missing), MAX_RUNTIME (s; the script stops itself).
# The namespaces are made here with unique names and removed on every exit path;
# neither has a default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ROUNDS=${ROUNDS:-5}
COUNT=${COUNT:-500}
MODES=${MODES:-plain connected weft}
case "$ROUNDS$COUNT" in *[!0-9]*) echo "error: ROUNDS and COUNT must be whole numbers" >&2; exit 2 ;; esac
[ "$ROUNDS" -ge 1 ] && [ "$COUNT" -ge 1 ] || { echo "error: ROUNDS and COUNT must be at least 1" >&2; exit 2; }
for m in $MODES; do
    case $m in plain | connected | weft | weft-1 | weft-nogro) ;;
        *) echo "error: unknown mode '$m' (plain, connected, weft, weft-1, weft-nogro)" >&2; exit 2 ;;
    esac
done
# Each mode and round: COUNT pings 10 ms apart and a second to start.
SECONDS_PER_RUN=$((COUNT / 100 + 3))
MAX_RUNTIME=${MAX_RUNTIME:-$((ROUNDS * $(wc -w <<<"$MODES") * (SECONDS_PER_RUN + 2) + 60))}
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "error: ip missing (apt install iproute2)" >&2; exit 2; }
if [ -z "${UDPRTT:-}" ]; then
    UDPRTT=$ROOT/target/release/udprtt
    [ -x "$UDPRTT" ] || (cd "$ROOT" && cargo build --release -p weft-bench --bin udprtt)
fi

TAG="wu$$"
A="$TAG-a"; B="$TAG-b"
PIDS=()
IN_CLEANUP=0
. "$HERE/procs.sh"
cleanup() {
    IN_CLEANUP=1
    stop_all PIDS
    remove_netns "$A" "$B"
}
install_traps
start_watchdog
PIDS+=("$WATCHDOG_PID")

make_netns "$A" "$B"
ip link add "$TAG-va" netns "$A" type veth peer name "$TAG-vb" netns "$B"
ip -n "$A" addr add 198.51.100.1/24 dev "$TAG-va"
ip -n "$B" addr add 198.51.100.2/24 dev "$TAG-vb"
ip -n "$A" link set "$TAG-va" up
ip -n "$B" link set "$TAG-vb" up

echo "# udprtt: $ROUNDS rounds of $COUNT round trips per mode, 10 ms apart; $(date -u +%FT%TZ)"
for ((r = 1; r <= ROUNDS; r++)); do
    for m in $MODES; do
        mode=${m%%-*}
        echo_flags=()
        ping_flags=()
        case $m in
            weft-1) echo_flags=(--sockets 1) ;;
            weft-nogro) echo_flags=(--no-gro); ping_flags=(--no-gro) ;;
        esac
        ip netns exec "$A" "$UDPRTT" echo --mode "$mode" --listen 198.51.100.1:7000 \
            --peer 198.51.100.2:7001 --seconds "$SECONDS_PER_RUN" "${echo_flags[@]}" &
        echo_pid=$!
        PIDS+=("$echo_pid")
        sleep 0.5
        printf 'round %d %s: ' "$r" "$m"
        fg_run ip netns exec "$B" "$UDPRTT" ping --mode "$mode" --bind 198.51.100.2:7001 \
            --to 198.51.100.1:7000 --count "$COUNT" "${ping_flags[@]}"
        wait "$echo_pid" || { echo "error: the $m echo failed" >&2; exit 1; }
    done
done
