#!/usr/bin/env bash
# No-TUN throughput: one TCP stream from B to A's server (and back), B being
#   - a TUN member (the kernel's TCP over Weft's TUN: the baseline of the same run),
#   - a no-TUN member reached through its SOCKS5 server (--socks5),
#   - a no-TUN member reached through a port forward (--forward tcp://...),
# with B's CPU (utime+stime of the weft process over the run) and its peak resident
# memory under load. Every row is measured by the same tool (bench/src/bin/streamperf:
# iperf3 cannot speak SOCKS5). EasyTier's `--no-tun --socks5` is not measured here
# (no easytier-core on these machines; see bench/RESULTS.md).
#
#   A --veth-- B
#
#   sudo bench/netns/notun.sh                       # REPS=3, DURATION=8
#   sudo REPS=1 DURATION=3 bench/netns/notun.sh
#
# Environment: DURATION (s per run), REPS, WEFT (default target/release/weft, built if
# missing), OUT (default bench/results/notun), MAX_RUNTIME (s; the script stops itself).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-8}
REPS=${REPS:-3}
OUT=${OUT:-$ROOT/bench/results/notun}
MAX_RUNTIME=${MAX_RUNTIME:-$((REPS * 8 * (DURATION + 4) + 180))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 python3)" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi
PERF=$ROOT/target/release/streamperf
[ -x "$PERF" ] || (cd "$ROOT" && cargo build --release -p weft-bench --bin streamperf)

TAG="wn$$"
A="$TAG-a"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-notun-bench.XXXXXX)
chmod 755 "$WORK"
PIDS=()
NODES=()
stop_nodes() {
    for pid in "${NODES[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${NODES[@]}"; do wait "$pid" 2>/dev/null || true; done
    NODES=()
}
cleanup() {
    stop_nodes
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

CLK_TCK=$(getconf CLK_TCK)
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
B_PID=""
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Peak VmRSS while the run lasts (VmHWM would count the Argon2id key derivation at
# start, freed at once).
rss_during() { # pid seconds -> max KiB
    local max=0 v end=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$end" ]; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
        [ "${v:-0}" -gt "$max" ] && max=$v
        sleep 0.5
    done
    echo "$max"
}
measure() { # row target [streamperf args...]
    local row=$1 target=$2; shift 2
    local c0 c1 t0 t1 j rss
    c0=$(cpu_ticks "$B_PID"); t0=$(date +%s.%N)
    rss_during "$B_PID" "$DURATION" >"$WORK/rss" &
    local w=$!
    j=$(nsx "$B" "$PERF" run "$target" --secs "$DURATION" "$@" 2>&1 || true)
    wait "$w" 2>/dev/null || true
    t1=$(date +%s.%N); c1=$(cpu_ticks "$B_PID")
    rss=$(cat "$WORK/rss" 2>/dev/null || echo 0)
    python3 - "$row" "$j" "$c0" "$c1" "$t0" "$t1" "$CLK_TCK" "$rss" >>"$RUNS" <<'EOF'
import json, sys
row, text, c0, c1, t0, t1, hz, rss = sys.argv[1:9]
try:
    r = json.loads(text.strip().splitlines()[-1])
    cpu = (int(c1) - int(c0)) / int(hz) / (float(t1) - float(t0)) * 100
    print(json.dumps({"row": row, "gbps": r["gbps"], "cpu": round(cpu, 1), "rss_kib": int(rss)}))
except Exception as e:
    print(json.dumps({"row": row, "error": f"{e}: {text[-300:]}"}))
EOF
    tail -1 "$RUNS" >&2
}

# A: TUN member with the stream server on its overlay address.
NET=(--network-name bench --network-secret "no-tun bench secret" --threads 1 --no-ipv6)
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >>"$WORK/$name.log" 2>&1 &
    NODES+=("$!")
}
start_weft "$A" a -i 10.126.160.1/24 -l udp://0.0.0.0:11010 --hostname alpha
sleep 0.5
nsx "$A" "$PERF" serve 10.126.160.1:5001 >/dev/null 2>&1 &
PIDS+=("$!")
# A runs to the end (stopped with the other helpers).
PIDS+=("${NODES[0]}")
NODES=()

wait_reach() { # what
    local ok=0
    for _ in $(seq 100); do
        if nsx "$A" ping -c 1 -W 1 10.126.160.2 >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.2
    done
    [ "$ok" = 1 ] || { echo "error: A never reached B ($1)" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
}

# B as a TUN member: the baseline.
start_weft "$B" b -i 10.126.160.2/24 -l udp://0.0.0.0:11010 -p udp://192.0.2.1:11010 --hostname beta
B_PID=${NODES[0]}
wait_reach "TUN"
for rep in $(seq "$REPS"); do
    measure "weft TUN B->A" 10.126.160.1:5001
    measure "weft TUN A->B" 10.126.160.1:5001 --down
done
stop_nodes
rm -rf "$WORK/b-state"

# B without TUN, as nobody with no capabilities.
install -m 755 "$WEFT" "$WORK/weft-copy"
mkdir -p "$WORK/home" "$WORK/run"; chown nobody:nogroup "$WORK/home" "$WORK/run"
ip netns exec "$B" setpriv --reuid nobody --regid nogroup --clear-groups --inh-caps=-all --bounding-set=-all \
    env HOME="$WORK/home" XDG_RUNTIME_DIR="$WORK/run" "$WORK/weft-copy" up "${NET[@]}" -i 10.126.160.2/24 \
    -l udp://0.0.0.0:11010 -p udp://192.0.2.1:11010 --hostname beta --no-tun \
    --socks5 127.0.0.1:1080 --forward tcp://127.0.0.1:6001=10.126.160.1:5001 >>"$WORK/b.log" 2>&1 &
NODES+=("$!")
B_PID=${NODES[0]}
wait_reach "no TUN"
for rep in $(seq "$REPS"); do
    measure "weft no-TUN SOCKS5 B->A" alpha:5001 --socks5 127.0.0.1:1080
    measure "weft no-TUN SOCKS5 A->B" alpha:5001 --socks5 127.0.0.1:1080 --down
    measure "weft no-TUN forward B->A" 127.0.0.1:6001
    measure "weft no-TUN forward A->B" 127.0.0.1:6001 --down
done
stop_nodes

mkdir -p "$OUT"
python3 - "$RUNS" "$OUT" "$DURATION" "$REPS" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, duration, reps = sys.argv[1:5]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
def med(row, key="gbps"):
    v = [x[key] for x in runs if x["row"] == row and x.get(key) is not None]
    return statistics.median(v) if v else None
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
lines = [
    "# No-TUN throughput",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo REPS={reps} DURATION={duration} bench/netns/notun.sh`; one TCP stream (streamperf), medians of {reps} runs of {duration} s; aes-128-gcm, --threads 1, UDP underlay.",
    "",
    "| path | B->A Gbit/s | A->B Gbit/s | ÷ TUN B->A | ÷ TUN A->B | B CPU % (B->A / A->B) | B RSS MiB |",
    "|---|---|---|---|---|---|---|",
]
tun_up, tun_down = med("weft TUN B->A"), med("weft TUN A->B")
f = lambda v: f"{v:.2f}" if v is not None else "failed"
for name, row in [("TUN (kernel TCP)", "weft TUN"), ("no-TUN, SOCKS5", "weft no-TUN SOCKS5"), ("no-TUN, --forward", "weft no-TUN forward")]:
    up, down = med(f"{row} B->A"), med(f"{row} A->B")
    r1 = f"{up / tun_up:.2f}" if up and tun_up else "-"
    r2 = f"{down / tun_down:.2f}" if down and tun_down else "-"
    c1, c2 = med(f"{row} B->A", "cpu"), med(f"{row} A->B", "cpu")
    rss = max([x.get("rss_kib", 0) for x in runs if x["row"].startswith(row)] or [0]) / 1024
    lines.append(f"| {name} | {f(up)} | {f(down)} | {r1} | {r2} | {c1} / {c2} | {rss:.1f} |")
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
json.dump({"runs": runs}, open(os.path.join(out, "results.json"), "w"), indent=1)
print("\n".join(lines))
EOF
