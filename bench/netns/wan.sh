#!/usr/bin/env bash
# A long path: single-stream throughput over QUIC (or TCP) when the round trip is tens of
# milliseconds, for one or more Weft builds in the same run. This machine has no netem,
# so a userspace forwarder in a middle namespace (bench/src/bin/udpdelay.rs, UDP only)
# holds every datagram DELAY_MS each way; A cannot reach B except through it.
#
#   A --veth-- M (udpdelay) --veth-- B        (M does not forward IP)
#
#   sudo bench/netns/wan.sh                                 # target/release/weft, 25 ms each way
#   sudo WEFTS="/tmp/old /tmp/new" DELAY_MS=25 REPS=2 bench/netns/wan.sh
#
# Environment: WEFTS (binaries, default target/release/weft, built if missing), DELAY_MS
# (each way, default 25), DURATION (s per run, default 10), REPS (default 2, builds
# interleaved), TCP_BUF (the tunnel TCP's largest socket buffer in A and B, bytes;
# default 64 MiB), OUT (default bench/results/wan), MAX_RUNTIME (s; the script stops
# itself).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DELAY_MS=${DELAY_MS:-25}
DURATION=${DURATION:-10}
REPS=${REPS:-2}
TCP_BUF=${TCP_BUF:-$((64 << 20))}
OUT=${OUT:-$ROOT/bench/results/wan}
if [ -z "${WEFTS:-}" ]; then
    WEFTS=$ROOT/target/release/weft
    [ -x "$WEFTS" ] || (cd "$ROOT" && cargo build --release -p weft)
fi
read -r -a BUILDS <<<"$WEFTS"
DELAY=$ROOT/target/release/udpdelay
[ -x "$DELAY" ] || (cd "$ROOT" && cargo build --release -p weft-bench --bin udpdelay)
NB=${#BUILDS[@]}
MAX_RUNTIME=${MAX_RUNTIME:-$((REPS * NB * (DURATION + 200) + 60))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3)" >&2; exit 2; }
done
case "$DELAY_MS" in '' | *[!0-9]*) echo "error: DELAY_MS: expected whole milliseconds, got '$DELAY_MS'" >&2; exit 2 ;; esac
case "$TCP_BUF" in '' | *[!0-9]*) echo "error: TCP_BUF: expected bytes, got '$TCP_BUF'" >&2; exit 2 ;; esac
for w in "${BUILDS[@]}"; do [ -x "$w" ] || { echo "error: WEFTS: $w is not an executable" >&2; exit 2; }; done

TAG="ww$$"
A="$TAG-a"; M="$TAG-m"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-wan-bench.XXXXXX)
PIDS=()
RUN_PIDS=()
WEFT_PIDS=()
IN_CLEANUP=0
. "$HERE/procs.sh"
cleanup() {
    IN_CLEANUP=1
    stop_all WEFT_PIDS
    stop_all RUN_PIDS
    stop_all PIDS
    for ns in "$A" "$M" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
install_traps
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$M" "$B"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$TAG-am" netns "$A" type veth peer name "$TAG-ma" netns "$M"
ip link add "$TAG-mb" netns "$M" type veth peer name "$TAG-bm" netns "$B"
nsx "$A" ip addr add 198.51.100.1/24 dev "$TAG-am"; nsx "$A" ip link set "$TAG-am" up
nsx "$M" ip addr add 198.51.100.2/24 dev "$TAG-ma"; nsx "$M" ip link set "$TAG-ma" up
nsx "$M" ip addr add 203.0.113.1/24 dev "$TAG-mb"; nsx "$M" ip link set "$TAG-mb" up
nsx "$B" ip addr add 203.0.113.2/24 dev "$TAG-bm"; nsx "$B" ip link set "$TAG-bm" up

# The tunnel's TCP (iperf3 in A and B) may grow its windows to TCP_BUF: Linux's
# default ceiling (6 MiB of receive buffer, about 3 MiB of window) caps one stream at
# ~0.47 Gbit/s over 51 ms, below what the tunnel carries.
for ns in "$A" "$B"; do
    nsx "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 $TCP_BUF" net.ipv4.tcp_wmem="4096 16384 $TCP_BUF"
done

NET=(--network-name bench --network-secret "wan bench secret")
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
for rep in $(seq "$REPS"); do
    for i in "${!BUILDS[@]}"; do
        w=${BUILDS[$i]}
        # The forwarder lives for one run; B listens on QUIC only, A dials it through M.
        # Not through nsx: $! must be the forwarder itself (ip netns exec execs it), so
        # that the run's end stops it; a leftover one kept the port, the next run's
        # could not bind, and its tunnel died with the old one mid-run.
        ip netns exec "$M" "$DELAY" --listen 198.51.100.2:11012 --bind 203.0.113.1:0 --to 203.0.113.2:11012 \
            --delay-ms "$DELAY_MS" --seconds $((DURATION + 40)) 2>>"$WORK/delay.log" &
        RUN_PIDS+=("$!")
        sleep 0.2
        kill -0 "${RUN_PIDS[-1]}" 2>/dev/null || { echo "error: the forwarder did not start" >&2; tail -5 "$WORK/delay.log" >&2; exit 1; }
        ip netns exec "$B" "$w" up "${NET[@]}" --state-dir "$WORK/b-state" --control "$WORK/b.sock" \
            -i 10.201.0.2/24 -l quic://0.0.0.0:11012 >>"$WORK/b.log" 2>&1 &
        WEFT_PIDS+=("$!")
        ip netns exec "$A" "$w" up "${NET[@]}" --state-dir "$WORK/a-state" --control "$WORK/a.sock" \
            -i 10.201.0.1/24 -p quic://198.51.100.2:11012 >>"$WORK/a.log" 2>&1 &
        WEFT_PIDS+=("$!")
        ok=0
        for _ in $(seq 150); do nsx "$A" ping -c 1 -W 1 10.201.0.2 >/dev/null 2>&1 && { ok=1; break; }; sleep 0.2; done
        [ "$ok" = 1 ] || { echo "error: no tunnel through the forwarder ($w)" >&2; tail -20 "$WORK/a.log" >&2; exit 1; }
        rtt=$(nsx "$A" ping -c 3 -i 0.2 10.201.0.2 2>/dev/null | awk -F/ '/^rtt/ {print $5}')
        nsx "$B" iperf3 -s -1 -D --pidfile "$WORK/iperf3.pid" >/dev/null
        sleep 0.5
        RUN_PIDS+=("$(cat "$WORK/iperf3.pid")")
        # A sends to B (the receive window B grants is what a long path needs).
        j=$(timeout $((DURATION + 30)) ip netns exec "$A" iperf3 -c 10.201.0.2 -t "$DURATION" -J 2>/dev/null || true)
        python3 - "$w" "$("$w" --version)" "$rep" "${rtt:-}" "$j" >>"$RUNS" <<'EOF'
import json, sys
path, version, rep, rtt, text = sys.argv[1:6]
row = {"weft": path, "version": version, "rep": int(rep), "overlay_rtt_ms": float(rtt) if rtt else None}
try:
    end = json.loads(text)["end"]
    row["gbps"] = end["sum_received"]["bits_per_second"] / 1e9
    row["retransmits"] = end.get("sum_sent", {}).get("retransmits", 0)
except Exception as e:
    row["error"] = str(e)
print(json.dumps(row))
EOF
        tail -1 "$RUNS" >&2
        stop_all WEFT_PIDS
        stop_all RUN_PIDS
        rm -rf "$WORK"/{a,b}-state
    done
done

mkdir -p "$OUT"
python3 - "$RUNS" "$OUT" "$DELAY_MS" "$DURATION" "$REPS" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, delay, duration, reps = sys.argv[1:6]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
lines = [
    "# A long path over QUIC",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo DELAY_MS={delay} DURATION={duration} REPS={reps} bench/netns/wan.sh`; A -> B, one iperf3 TCP "
    f"stream over Weft over QUIC, every datagram held {delay} ms each way by a forwarder in between; builds interleaved.",
    "",
    "| build | runs | Gbit/s median | Gbit/s each | overlay RTT ms (ping) | retransmits |",
    "|---|---|---|---|---|---|",
]
for path in dict.fromkeys(r["weft"] for r in runs):
    rs = [r for r in runs if r["weft"] == path]
    g = [r["gbps"] for r in rs if "gbps" in r]
    rtt = [r["overlay_rtt_ms"] for r in rs if r.get("overlay_rtt_ms") is not None]
    lines.append(f"| {rs[0]['version']} | {len(rs)} | {statistics.median(g):.3f} | "
                 + ", ".join(f"{x:.3f}" for x in g) + " | "
                 + (f"{statistics.median(rtt):.1f}" if rtt else "–") + " | "
                 + ", ".join(str(r.get("retransmits", "–")) for r in rs) + " |" if g else
                 f"| {rs[0]['version']} | {len(rs)} | FAIL | | | |")
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
with open(os.path.join(out, "runs.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in runs)
print("\n".join(lines))
EOF
cat "$WORK/delay.log" >&2 || true
