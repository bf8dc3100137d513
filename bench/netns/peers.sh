#!/usr/bin/env bash
# Many peers at once: one hub exchanging traffic with 1, 4 and 8 members together, one
# iperf3 stream per member (member -> hub), all started at once. Aggregate throughput,
# its ratio to one member, and fairness between the streams (slowest / fastest).
#
#   H --bridge-- M1 .. M8          (every node its own namespace and weft process)
#
#   sudo bench/netns/peers.sh                       # REPS=3, DURATION=10, COUNTS="1 4 8"
#   sudo REPS=1 DURATION=3 COUNTS="1 4" bench/netns/peers.sh
#   sudo TRANSPORT=tcp bench/netns/peers.sh         # members on TCP connections
#
# Every weft runs on the same machine as the others (2 cores here): the figures say how
# one hub shares itself between members, and the whole mesh shares the CPU.
# Environment: DURATION, REPS, COUNTS, TRANSPORT (udp, tcp, ws or quic: every node listens
# on that one only, so the paths stay on it), HUB_THREADS (the hub's --threads, default
# 2), WEFT (default target/release/weft), OUT (default bench/results/peers, or
# bench/results/peers-TRANSPORT), MAX_RUNTIME (s; the script stops itself).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-10}
REPS=${REPS:-3}
COUNTS=${COUNTS:-1 4 8}
TRANSPORT=${TRANSPORT:-udp}
HUB_THREADS=${HUB_THREADS:-2}
case "$TRANSPORT" in
    udp) OUT=${OUT:-$ROOT/bench/results/peers} ;;
    tcp|ws|quic) OUT=${OUT:-$ROOT/bench/results/peers-$TRANSPORT} ;;
    *) echo "error: TRANSPORT must be udp, tcp, ws or quic (got $TRANSPORT)" >&2; exit 2 ;;
esac
case "$HUB_THREADS" in ''|*[!0-9]*|0) echo "error: HUB_THREADS must be a positive number" >&2; exit 2 ;; esac
MAX=0
for n in $COUNTS; do
    case "$n" in ''|*[!0-9]*) echo "error: COUNTS must be numbers (got $n)" >&2; exit 2 ;; esac
    [ "$n" -ge 1 ] && [ "$n" -le 16 ] || { echo "error: COUNTS: 1 to 16 members" >&2; exit 2; }
    [ "$n" -gt "$MAX" ] && MAX=$n
done
MAX_RUNTIME=${MAX_RUNTIME:-$(( $(wc -w <<<"$COUNTS") * REPS * (DURATION + 10) + 180 ))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3)" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wm$$"
SW="$TAG-sw"; H="$TAG-h"
NSS=("$SW" "$H")
for i in $(seq "$MAX"); do NSS+=("$TAG-m$i"); done
WORK=$(mktemp -d /tmp/weft-peers-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "${NSS[@]}"; do
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
for ns in "${NSS[@]}"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
nsx "$SW" ip link add br0 type bridge
nsx "$SW" ip link set br0 up
attach() { # ns index
    local ns=$1 i=$2
    ip link add "$TAG-p$i" netns "$SW" type veth peer name eth0 netns "$ns"
    nsx "$SW" ip link set "$TAG-p$i" master br0
    nsx "$SW" ip link set "$TAG-p$i" up
    nsx "$ns" ip addr add "192.0.2.$((i + 1))/24" dev eth0
    nsx "$ns" ip link set eth0 up
}
attach "$H" 0
for i in $(seq "$MAX"); do attach "$TAG-m$i" "$i"; done

NET=(--network-name bench --network-secret "peers bench secret" -l "$TRANSPORT://0.0.0.0:11010")
HUB_URI="$TRANSPORT://192.0.2.1:11010"
[ "$TRANSPORT" = ws ] && HUB_URI="$HUB_URI/"
# Started with ip netns exec itself (not the nsx function): $! is then weft, not a subshell.
ip netns exec "$H" "$WEFT" up "${NET[@]}" -i 10.126.0.1/16 --threads "$HUB_THREADS" --state-dir "$WORK/h-state" --control "$WORK/h.sock" \
    >"$WORK/h.log" 2>&1 &
PIDS+=("$!")
sleep 0.3
for i in $(seq "$MAX"); do
    ip netns exec "$TAG-m$i" "$WEFT" up "${NET[@]}" -i "10.126.1.$i/16" --threads 1 -p "$HUB_URI" \
        --state-dir "$WORK/m$i-state" --control "$WORK/m$i.sock" >"$WORK/m$i.log" 2>&1 &
    PIDS+=("$!")
done
for i in $(seq "$MAX"); do
    ok=0
    for _ in $(seq 100); do
        if nsx "$TAG-m$i" ping -c 1 -W 1 10.126.0.1 >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.2
    done
    [ "$ok" = 1 ] || { echo "error: member $i never reached the hub" >&2; tail -20 "$WORK/m$i.log" >&2; exit 1; }
    nsx "$H" iperf3 -s -p $((5200 + i)) -D --pidfile "$WORK/iperf3-$i.pid" >/dev/null
done
sleep 0.5
for i in $(seq "$MAX"); do PIDS+=("$(cat "$WORK/iperf3-$i.pid")"); done

RUNS="$WORK/runs.jsonl"
: >"$RUNS"
HUB_PID=$(pgrep -f "$WORK/h.sock" | head -1)
# Resident memory under load: sampled while the streams run (VmHWM would report the
# 46 MiB Argon2id derivation of the key at start, freed at once).
# Each sample: VmRSS, and of it RssAnon (the process's own memory) and RssFile (mostly
# the binary's code pages, shared with every process that maps the same file).
sample_rss() { # seconds
    local max=0 v line best="0 0 0"
    for _ in $(seq $(( $1 * 2 ))); do
        line=$(awk '/^VmRSS/ {r=$2} /^RssAnon/ {a=$2} /^RssFile/ {f=$2} END {print r+0, a+0, f+0}' \
            "/proc/$HUB_PID/status" 2>/dev/null || echo "0 0 0")
        v=${line%% *}
        if [ "$v" -gt "$max" ]; then max=$v; best=$line; fi
        sleep 0.5
    done
    echo "$best" >>"$WORK/rss.txt"
}
: >"$WORK/rss.txt"
for n in $COUNTS; do
    for rep in $(seq "$REPS"); do
        echo "members $n, rep $rep/$REPS" >&2
        for i in $(seq "$n"); do
            nsx "$TAG-m$i" iperf3 -c 10.126.0.1 -p $((5200 + i)) -t "$DURATION" -J >"$WORK/run-$n-$rep-$i.json" 2>/dev/null &
        done
        sample_rss "$DURATION"
        wait_for=$(( DURATION + 15 ))
        for _ in $(seq $((wait_for * 10))); do
            pgrep -f "iperf3 -c 10.126.0.1" >/dev/null || break
            sleep 0.1
        done
        python3 - "$n" "$rep" "$WORK" >>"$RUNS" <<'EOF'
import json, sys
n, rep, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
streams = []
for i in range(1, n + 1):
    try:
        end = json.load(open(f"{work}/run-{n}-{rep}-{i}.json"))["end"]
        streams.append(end["sum_received"]["bits_per_second"] / 1e9)
    except Exception:
        streams.append(0.0)
print(json.dumps({"members": n, "rep": rep, "streams_gbps": streams}))
EOF
        tail -1 "$RUNS" >&2
    done
done
RSS_LINE=$(sort -n "$WORK/rss.txt" | tail -1)
read -r RSS_H RSS_ANON RSS_FILE <<<"$RSS_LINE"

mkdir -p "$OUT"
python3 - "$RUNS" "$OUT" "$DURATION" "$REPS" "$RSS_H" "$COUNTS" "$TRANSPORT" "$HUB_THREADS" "$RSS_ANON" "$RSS_FILE" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, duration, reps, rss, counts, transport, hub_threads, rss_anon, rss_file = sys.argv[1:11]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
agg = {}
fair = {}
for n in map(int, counts.split()):
    rs = [r for r in runs if r["members"] == n]
    agg[n] = statistics.median(sum(r["streams_gbps"]) for r in rs)
    fair[n] = statistics.median((min(r["streams_gbps"]) / max(r["streams_gbps"])) if max(r["streams_gbps"]) > 0 else 0 for r in rs)
one = agg.get(1)
lines = [
    "# Many peers: one hub, several members at once",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo REPS={reps} DURATION={duration} COUNTS=\"{counts}\" TRANSPORT={transport} HUB_THREADS={hub_threads} bench/netns/peers.sh`; one iperf3 TCP stream per member (member -> hub), all at once; medians of {reps} runs of {duration} s; aes-128-gcm, direct {transport} paths, hub with --threads {hub_threads}; every weft process shares the same cores.",
    "",
    "| members | aggregate Gbit/s | vs 1 member | slowest / fastest stream |",
    "|---|---|---|---|",
]
for n in map(int, counts.split()):
    ratio = f"{agg[n] / one:.2f}x" if one else "-"
    lines.append(f"| {n} | {agg[n]:.2f} | {ratio} | {fair[n]:.2f} |")
lines += ["", f"Hub resident memory under load (largest VmRSS sampled every 0.5 s while the streams ran): {int(rss) / 1024:.1f} MiB, of which anonymous {int(rss_anon) / 1024:.1f} MiB and file-backed {int(rss_file) / 1024:.1f} MiB (the binary's code pages)."]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
json.dump({"runs": runs, "transport": transport, "hub_threads": int(hub_threads), "hub_rss_under_load_kib": int(rss), "hub_rss_anon_kib": int(rss_anon), "hub_rss_file_kib": int(rss_file)}, open(os.path.join(out, "results.json"), "w"), indent=1)
print("\n".join(lines))
EOF
