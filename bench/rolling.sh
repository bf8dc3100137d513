#!/usr/bin/env bash
# Rolling upgrade under load: 5 Weft nodes in namespaces running the previous release,
# replaced one at a time by this build (SIGTERM, start the new binary on the same state
# directory, rejoin), while iperf3 and checksummed transfers run; then a second pass that
# restarts each node on this build again (the next upgrade: both ends now say goodbye
# when they stop). Bounded: stops by itself, removes everything it made.
#
#   sudo bench/rolling.sh
#
# Per step it reports: the seconds from the new process's start until another node
# pings the replaced one (aim <= 2 s), the pings lost by a 10-per-second ping to it
# across the step, and the transfers broken meanwhile. Throughout: iperf3 n4 -> n5
# (TCP, 100 Mbit/s paced) and back-to-back 8 MiB checksummed TCP transfers n2 -> n3
# (SHA-256 both ends; aim: none broken, none corrupt).
#
# Environment: OLD (the previous release's weft; default: scripts/build-previous.sh),
# NEW (default target/release/weft, built if missing), OUT (default
# bench/results/rolling). Exit status: 0 when every node rejoined and no completed
# transfer was corrupt, 3 otherwise, 1 on an error.
# Topology: a switch namespace with a bridge, nodes n1..n5 on 10.212.0.k/24 (overlay
# 10.213.0.k/24); no default routes, nothing leaves the namespaces.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/rolling}
N=5
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 python3 ping; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3 iputils-ping)" >&2; exit 2; }
done
OLD=${OLD:-$("$ROOT/scripts/build-previous.sh")}
if [ -z "${NEW:-}" ]; then
    NEW=$ROOT/target/release/weft
    [ -x "$NEW" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="ru$$"
SW="$TAG-sw"
WORK=$(mktemp -d /tmp/weft-rolling.XXXXXX)
declare -A PID
BG=()
cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        mkdir -p "$OUT/logs" && cp "$WORK"/n*.log "$OUT/logs/" 2>/dev/null || true
        echo "rolling.sh: the nodes' logs are in $OUT/logs" >&2
    fi
    for p in "${PID[@]}" "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PID[@]}" "${BG[@]}"; do wait "$p" 2>/dev/null || true; done
    for k in $(seq $N); do
        ip netns pids "$TAG-n$k" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$TAG-n$k" 2>/dev/null || true
    done
    ip netns del "$SW" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
( sleep 600; echo "rolling.sh: time limit reached; stopping" >&2; kill -TERM $$ ) &
BG+=("$!")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
ip netns add "$SW"
nsx "$SW" ip link add br0 type bridge
nsx "$SW" ip link set br0 up
for k in $(seq $N); do
    ns="$TAG-n$k"
    ip netns add "$ns"
    nsx "$ns" ip link set lo up
    ip link add eth0 netns "$ns" type veth peer name "v$k" netns "$SW"
    nsx "$SW" ip link set "v$k" master br0 up
    nsx "$ns" ip addr add "10.212.0.$k/24" dev eth0
    nsx "$ns" ip link set eth0 up
done

start_node() { # k binary
    local k=$1 bin=$2 peers=()
    # Every node dials the two first ones (they dial each other): a ring of links that
    # survives any one node's restart.
    [ "$k" -ne 1 ] && peers+=(-p udp://10.212.0.1:11010)
    [ "$k" -ne 2 ] && peers+=(-p udp://10.212.0.2:11010)
    echo "=== $(date +%T.%N) start $bin" >>"$WORK/n$k.log"
    ip netns exec "$TAG-n$k" "$bin" up --network-name rolling --network-secret "rolling secret" \
        -i "10.213.0.$k/24" -l udp://0.0.0.0:11010 --threads 1 "${peers[@]}" \
        --state-dir "$WORK/n$k-state" --control "$WORK/n$k.sock" >>"$WORK/n$k.log" 2>&1 &
    PID[$k]=$!
}
reach() { nsx "$TAG-n$1" ping -c 1 -W 1 "10.213.0.$2" >/dev/null 2>&1; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
# Seconds (50 ms steps) from $3 until $1 pings $2, at most 30 s; prints it or "never".
time_to_reach() {
    local from=$1 to=$2 start=$3
    while ! nsx "$TAG-n$from" ping -c 1 -W 0.2 "10.213.0.$to" >/dev/null 2>&1; do
        if python3 -c "import sys,time; sys.exit(0 if time.time() - float(sys.argv[1]) > 30 else 1)" "$start"; then
            echo never; return
        fi
        sleep 0.05
    done
    since "$start"
}

for k in $(seq $N); do start_node "$k" "$OLD"; done
for k in $(seq 2 $N); do
    [ "$(time_to_reach 1 "$k" "$(now)")" != never ] || { echo "error: n$k never came up" >&2; tail "$WORK/n$k.log" >&2; exit 1; }
done
echo "mesh of the previous release up: $("$OLD" --version)" >&2
sleep 3

# Traffic: iperf3 n4 -> n5 (restarted when a step breaks it), checksummed transfers
# n2 -> n3.
nsx "$TAG-n5" iperf3 -s >/dev/null 2>&1 &
BG+=("$!")
: >"$WORK/iperf.txt"
(
    while :; do
        nsx "$TAG-n4" iperf3 -c 10.213.0.5 -t 600 -b 100M >/dev/null 2>&1 && break
        echo "$(date +%s.%N) broken" >>"$WORK/iperf.txt"
        sleep 0.5
    done
) &
BG+=("$!")
cat >"$WORK/xfer.py" <<'EOF'
# recv: python3 xfer.py recv ADDR PORT  -> prints "<bytes> <sha256>" per connection
# send: python3 xfer.py send ADDR PORT BYTES SEED -> prints "<start> <end> <bytes> <sha256>"
import hashlib, random, socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(4)
    while True:
        c, _ = s.accept(); c.settimeout(60); h = hashlib.sha256(); n = 0
        try:
            while True:
                b = c.recv(1 << 16)
                if not b: break
                h.update(b); n += len(b)
            print(n, h.hexdigest(), flush=True)
        except OSError as e:
            print(n, "error", flush=True)
        c.close()
else:
    total, seed = int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed); h = hashlib.sha256(); n = 0; start = time.time()
    try:
        s = socket.create_connection((addr, port), timeout=60)
        while n < total:
            b = rng.randbytes(min(1 << 16, total - n)); s.sendall(b); h.update(b); n += len(b)
        s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
        print(start, time.time(), n, h.hexdigest(), flush=True)
    except OSError:
        print(start, time.time(), n, "failed", flush=True)
EOF
nsx "$TAG-n3" python3 "$WORK/xfer.py" recv 10.213.0.3 5201 >"$WORK/recv.txt" 2>&1 &
BG+=("$!")
sleep 0.5
: >"$WORK/sent.txt"
touch "$WORK/xfer.run"
(
    i=0
    while [ -e "$WORK/xfer.run" ]; do
        i=$((i + 1))
        nsx "$TAG-n2" python3 "$WORK/xfer.py" send 10.213.0.3 5201 $((8 << 20)) "$i" >>"$WORK/sent.txt" 2>/dev/null || true
    done
) &
BG+=("$!")
sleep 3

# The steps: each node in turn, first to this build, then restarted on it again.
: >"$WORK/steps.jsonl"
step() { # pass k binary
    local pass=$1 k=$2 bin=$3 watcher=1 t0 t1 rejoin lost
    [ "$k" -eq 1 ] && watcher=2
    # 10 pings a second from the watcher to the replaced node, across the whole step.
    nsx "$TAG-n$watcher" ping -i 0.1 -W 1 -w 8 "10.213.0.$k" >"$WORK/ping-$pass-$k.txt" 2>&1 &
    local pinger=$!
    sleep 1
    t0=$(now)
    kill -TERM "${PID[$k]}"
    wait "${PID[$k]}" 2>/dev/null || true
    start_node "$k" "$bin"
    t1=$(now)
    rejoin=$(time_to_reach "$watcher" "$k" "$t1")
    wait "$pinger" || true
    lost=$(python3 - "$WORK/ping-$pass-$k.txt" <<'EOF'
import re, sys
m = re.search(r"(\d+) packets transmitted, (\d+) received", open(sys.argv[1]).read())
print(int(m.group(1)) - int(m.group(2)) if m else -1)
EOF
)
    echo "{\"pass\": \"$pass\", \"node\": $k, \"stop_at\": $t0, \"start_at\": $t1, \"stopped_s\": $(python3 -c "print(f'{$t1 - $t0:.2f}')"), \"rejoin_s\": \"$rejoin\", \"pings_lost\": $lost}" >>"$WORK/steps.jsonl"
    echo "step $pass n$k: rejoined after $rejoin s, $lost pings lost" >&2
    sleep 2
}
for k in $(seq $N); do step upgrade "$k" "$NEW"; done
for k in $(seq $N); do step restart "$k" "$NEW"; done
sleep 3
rm -f "$WORK/xfer.run"
sleep 12

mkdir -p "$OUT"
python3 - "$WORK" "$OUT" "$("$OLD" --version)" "$("$NEW" --version)" <<'EOF'
import json, os, platform, sys, time
work, out, old, new = sys.argv[1:5]
steps = [json.loads(l) for l in open(f"{work}/steps.jsonl") if l.strip()]
sent = [l.split() for l in open(f"{work}/sent.txt") if l.strip()]
recv = [l.split() for l in open(f"{work}/recv.txt") if l.strip()]
iperf_breaks = [float(l.split()[0]) for l in open(f"{work}/iperf.txt") if l.strip()]
ok_recv = {(r[0], r[1]) for r in recv if len(r) == 2}
done = [s for s in sent if len(s) == 4 and s[3] != "failed"]
failed = [s for s in sent if len(s) == 4 and s[3] == "failed"]
corrupt = [s for s in done if (s[2], s[3]) not in ok_recv]
def during(t0, t1, spans):
    return sum(1 for a, b in spans if a <= t1 + 2 and b >= t0)
spans_failed = [(float(s[0]), float(s[1])) for s in failed]
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
lines = [
    "# Rolling upgrade under load", "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; "
    f"command `sudo bench/rolling.sh`; from `{old}` to `{new}`.", "",
    "| pass | node | stopped → started s | rejoin s (aim ≤ 2) | pings lost (10/s) | transfers broken | iperf3 broken |",
    "|---|---|---|---|---|---|---|",
]
for s in steps:
    t0, t1 = s["stop_at"], s["start_at"]
    end = t1 + (float(s["rejoin_s"]) if s["rejoin_s"] != "never" else 30)
    broken = during(t0, end, spans_failed)
    ib = sum(1 for t in iperf_breaks if t0 - 1 <= t <= end + 3)
    lines.append(f"| {s['pass']} | n{s['node']} | {s['stopped_s']} | {s['rejoin_s']} | {s['pings_lost']} | {broken} | {ib} |")
lines += ["", f"Checksummed 8 MiB transfers n2 -> n3: {len(done) - len(corrupt)} completed and matched, "
          f"{len(corrupt)} completed but did not match, {len(failed)} broken (reset or timed out)."]
bad = bool(corrupt) or any(s["rejoin_s"] == "never" for s in steps)
lines += ["", "Verdict: " + ("FAILED (a corrupt transfer or a node that never rejoined)" if bad else "ok")]
os.makedirs(out, exist_ok=True)
open(f"{out}/results.md", "w").write("\n".join(lines) + "\n")
json.dump({"steps": steps, "transfers": {"matched": len(done) - len(corrupt), "corrupt": len(corrupt),
           "broken": len(failed)}, "iperf_breaks": iperf_breaks}, open(f"{out}/results.json", "w"), indent=1)
print("\n".join(lines))
sys.exit(3 if bad else 0)
EOF
