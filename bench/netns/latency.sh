#!/usr/bin/env bash
# Netns latency comparison: how long a packet waits in each tunnel, idle and beside a
# download. compare.sh's two namespaces, tools and rows (the bare veth, Weft on each
# transport, wireguard-go, boringtun, nebula, EasyTier when installed), measuring
# instead of throughput:
#
#   * idle: PINGS pings 10 ms apart, B -> A (default 500);
#   * loaded: one iperf3 stream B -> A for DURATION s and, from its second second, pings
#     10 ms apart beside it, and a game flow (50 packets/s of 100 bytes over UDP, echoed
#     by A): p50 / p99 / p99.9 round trip, loss, the game flow's jitter, the bulk rate.
#
#   sudo bench/netns/latency.sh                    # REPS=3, DURATION=12, every tool
#   sudo bench/netns/latency.sh --only weft        # the baseline and Weft only
#
# Environment as compare.sh (WEFT, WEFT_FLAGS, WEFT_CIPHERS, WEFT_TRANSPORTS, REPS,
# DURATION, OUT, MAX_RUNTIME), plus PINGS. Outputs in $OUT (default
# bench/results/latency): latency.md, latency.json (every run), latency.svg (chart of
# the loaded round trips), logs/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export LATENCY=1
export REPS=${REPS:-3} DURATION=${DURATION:-12} STREAMS=1
export WEFT_CIPHERS=${WEFT_CIPHERS:-aes-128-gcm}
export WEFT_TRANSPORTS=${WEFT_TRANSPORTS:-"udp tcp ws wss quic"}
export OUT=${OUT:-$HERE/../results/latency}
exec "$HERE/compare.sh" "$@"
