#!/usr/bin/env bash
# Latency beside a download on a slow uplink: the veth between two namespaces is
# limited to RATE each way (tbf), one iperf3 stream runs B -> A with the congestion
# control CC, and 100 pings a second go B -> A beside it: the bare link first, then
# Weft over each transport. What a ping waits is the link's own queue (tbf) plus
# whatever the tunnel holds in front of it.
#
#   sudo bench/netns/uplink.sh                        # RATE=50mbit, CC="cubic bbr", udp tcp ws
#   sudo RATE=20mbit CC=cubic TRANSPORTS=tcp bench/netns/uplink.sh
#
# Environment: RATE (tc rate, default 50mbit), CC (inner TCP congestion controls,
# default "cubic bbr"), TRANSPORTS (default "udp tcp ws"; also wss, quic), DURATION (s of load per
# row, default 8), REPS (default 1), WEFT (binary; default target/release/weft, built
# if missing), OUT (default bench/results/uplink), MAX_RUNTIME (s; stops itself).
# Namespaces are made here with unique names and removed on every exit path; none has
# a default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RATE=${RATE:-50mbit}
CC=${CC:-cubic bbr}
TRANSPORTS=${TRANSPORTS:-udp tcp ws}
DURATION=${DURATION:-8}
REPS=${REPS:-1}
OUT=${OUT:-$ROOT/bench/results/uplink}
ROWS=$(( (1 + $(wc -w <<<"$TRANSPORTS")) * $(wc -w <<<"$CC") * REPS ))
MAX_RUNTIME=${MAX_RUNTIME:-$((ROWS * (DURATION + 15) + 60))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip tc iperf3 ping python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 iputils-ping python3)" >&2; exit 2; }
done
case "$DURATION$REPS" in *[!0-9]*) echo "error: DURATION and REPS must be whole numbers" >&2; exit 2 ;; esac
[[ $RATE =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
    { echo "error: RATE $RATE: expected a tc rate such as 50mbit or 800kbit" >&2; exit 2; }
for cc in $CC; do
    grep -qw -- "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control ||
        { echo "error: CC $cc: this kernel has $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)" >&2; exit 2; }
done
[ "$DURATION" -ge 3 ] || { echo "error: DURATION must be at least 3 (the pings start after 1 s)" >&2; exit 2; }
for t in $TRANSPORTS; do
    case "$t" in udp | tcp | ws | wss | quic) ;; *) echo "error: transport $t: expected udp, tcp, ws, wss or quic" >&2; exit 2 ;; esac
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wu$$"
A="$TAG-a"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-uplink-bench.XXXXXX)
PIDS=()
WEFTS=()
IN_CLEANUP=0
. "$HERE/procs.sh"
cleanup() {
    IN_CLEANUP=1
    stop_all WEFTS
    stop_all PIDS
    remove_netns "$A" "$B"
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
make_netns "$A" "$B"
ip link add "$TAG-a" netns "$A" type veth peer name "$TAG-b" netns "$B"
nsx "$A" ip addr add 198.51.100.1/24 dev "$TAG-a"; nsx "$A" ip link set "$TAG-a" up
nsx "$B" ip addr add 198.51.100.2/24 dev "$TAG-b"; nsx "$B" ip link set "$TAG-b" up
# The slow link: RATE each way, a queue of at most 100 ms (a modem's).
for ns in "$A" "$B"; do
    nsx "$ns" tc qdisc add dev "$TAG-${ns##*-}" root tbf rate "$RATE" burst 64kbit latency 100ms
done
nsx "$A" iperf3 -s -D --pidfile "$WORK/iperf3.pid" >/dev/null
sleep 0.5
PIDS+=("$(cat "$WORK/iperf3.pid")")

RUNS="$WORK/runs.jsonl"
: >"$RUNS"
run() { # row cc dst
    local row=$1 cc=$2 dst=$3 ip
    nsx "$B" iperf3 -c "$dst" -t "$DURATION" -C "$cc" -J >"$WORK/iperf.json" 2>/dev/null &
    ip=$!
    sleep 1
    nsx "$B" ping -n -i 0.01 -c $(((DURATION - 2) * 100)) -W 1 "$dst" >"$WORK/ping.txt" 2>/dev/null || true
    wait "$ip" || true
    python3 - "$row" "$cc" "$WORK/ping.txt" "$WORK/iperf.json" "$(((DURATION - 2) * 100))" >>"$RUNS" <<'EOF'
import json, re, sys
row, cc, ping, iperf, sent = sys.argv[1:6]
r = sorted(float(m) for m in re.findall(r"time=([0-9.]+)", open(ping).read()))
q = lambda p: r[min(len(r) - 1, int(p * len(r)))] if r else None
try:
    mbps = json.load(open(iperf))["end"]["sum_received"]["bits_per_second"] / 1e6
except Exception:
    mbps = None
print(json.dumps({"row": row, "cc": cc, "p50": q(0.5), "p99": q(0.99), "max": r[-1] if r else None,
                  "lost": int(sent) - len(r), "sent": int(sent), "mbps": mbps}))
EOF
    tail -1 "$RUNS" >&2
}

NET=(--network-name bench --network-secret "uplink bench secret" --threads 1)
for rep in $(seq "$REPS"); do
    for cc in $CC; do run "bare link" "$cc" 198.51.100.1; done
    for t in $TRANSPORTS; do
        case "$t" in udp | tcp) port=11010 ;; ws) port=11011 ;; wss | quic) port=11012 ;; esac
        ip netns exec "$A" "$WEFT" up "${NET[@]}" -i 10.126.126.1/24 -l "$t://0.0.0.0:$port" \
            --state-dir "$WORK/a-state" --control "$WORK/a.sock" >>"$WORK/a.log" 2>&1 &
        WEFTS+=("$!")
        sleep 0.3
        ip netns exec "$B" "$WEFT" up "${NET[@]}" -i 10.126.126.2/24 -l "$t://0.0.0.0:$port" -p "$t://198.51.100.1:$port" \
            --state-dir "$WORK/b-state" --control "$WORK/b.sock" >>"$WORK/b.log" 2>&1 &
        WEFTS+=("$!")
        ok=0
        for _ in $(seq 100); do
            if nsx "$B" ping -c 1 -W 1 10.126.126.1 >/dev/null 2>&1; then ok=1; break; fi
            sleep 0.2
        done
        [ "$ok" = 1 ] || { echo "error: B never reached A over $t" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
        for cc in $CC; do run "weft over $t" "$cc" 10.126.126.1; done
        stop_all WEFTS
        rm -rf "$WORK"/{a,b}-state
    done
done

mkdir -p "$OUT"
cp "$RUNS" "$OUT/runs.jsonl"
python3 - "$RUNS" "$OUT" "$RATE" "$CC" "$TRANSPORTS" "$DURATION" "$REPS" "$("$WEFT" --version)" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, rate, ccs, transports, duration, reps, version = sys.argv[1:9]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
med = lambda xs: statistics.median(xs) if xs else None
fmt = lambda v, f="{:.1f}": "–" if v is None else f.format(v)
lines = [
    "# Latency beside a download on a slow uplink",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; {version}.",
    f"Command: `sudo RATE={rate} CC=\"{ccs}\" TRANSPORTS=\"{transports}\" DURATION={duration} REPS={reps} bench/netns/uplink.sh`.",
    f"The veth limited to {rate} each way (tbf, 100 ms queue); one iperf3 stream B -> A and 100 pings/s B -> A beside it; medians over repetitions.",
    "",
    "| path | inner TCP | ping p50 ms | p99 ms | max ms | pings lost | bulk Mbit/s |",
    "|---|---|---|---|---|---|---|",
]
rows = []
for r in runs:
    if (r["row"], r["cc"]) not in rows:
        rows.append((r["row"], r["cc"]))
for row, cc in rows:
    rs = [r for r in runs if r["row"] == row and r["cc"] == cc]
    g = lambda k: med([r[k] for r in rs if r[k] is not None])
    lost = sum(r["lost"] for r in rs)
    sent = sum(r["sent"] for r in rs)
    lines.append(f"| {row} | {cc} | {fmt(g('p50'))} | {fmt(g('p99'))} | {fmt(g('max'))} | {lost} / {sent} | {fmt(g('mbps'))} |")
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
