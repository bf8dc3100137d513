#!/usr/bin/env bash
# Soak and chaos: 5 Weft nodes in namespaces under steady traffic while, every minute, a
# node is killed with SIGKILL and restarted, the mesh is partitioned and healed with
# nftables, and UDP is blocked and unblocked (sessions fall back to TCP and return).
# Bounded: stops by itself after DURATION (+ set-up), removes everything it made.
#
#   sudo bench/soak.sh                       # 10 minutes
#   sudo DURATION=60 bench/soak.sh           # the smoke run CI does
#
# Each minute (t = seconds into the minute):
#   t=5   SIGKILL the next victim (n3, n4, n5 in turn) and start it again at once; measure
#         how long until n1 pings it (aim <= 10 s)
#   t=20  partition {n1,n2} | {n3,n4,n5} on the switch (nftables); heal at t=30 and
#         measure how long until n1 and n4 ping each other again (aim <= 15 s)
#   t=40  drop all UDP between the nodes for 10 s (the tcp:// listeners carry the mesh)
# Throughout: iperf3 n4 -> n5 (TCP, 100 Mbit/s paced) and back-to-back 8 MiB checksummed
# TCP transfers n2 -> n3 (SHA-256 both ends; aim: no transfer that completes is corrupt,
# none lost). Per node: RSS, threads and fds at the first and last sample (nodes n1 and n2
# are never killed: their growth is the leak figure; aim < 5 MiB over 10 minutes).
#
# Environment: DURATION (s, default 600), WEFT (binary; default target/release/weft, built
# if missing), OUT (default bench/results/soak). Exit status: 0 when every transfer that
# completed matched, every restarted node was reached within 60 s and every partition
# healed within 60 s; 3 otherwise; 1 on an error.
# Topology: a switch namespace with a bridge, nodes n1..n5 on 10.210.0.k/24 (overlay
# 10.211.0.k/24); no default routes, nothing leaves the namespaces.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
DURATION=${DURATION:-600}
OUT=${OUT:-$ROOT/bench/results/soak}
N=5
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip nft iperf3 python3 ping; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 nftables iperf3 python3 iputils-ping)" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="sk$$"
SW="$TAG-sw"
WORK=$(mktemp -d /tmp/weft-soak.XXXXXX)
declare -A PID
BG=()
cleanup() {
    local rc=$?
    # After a failure the nodes' logs stay, beside the results.
    if [ "$rc" -ne 0 ]; then
        mkdir -p "$OUT/logs" && cp "$WORK"/n*.log "$OUT/logs/" 2>/dev/null || true
        echo "soak.sh: the nodes' logs are in $OUT/logs" >&2
    fi
    for p in "${PID[@]}" "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PID[@]}" "${BG[@]}"; do wait "$p" 2>/dev/null || true; done
    # Whatever still runs inside our namespaces (iperf3, the transfer scripts) is ours.
    for k in $(seq $N); do
        ip netns pids "$TAG-n$k" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$TAG-n$k" 2>/dev/null || true
    done
    ip netns del "$SW" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
( sleep $((DURATION + 240)); echo "soak.sh: time limit reached; stopping" >&2; kill -TERM $$ ) &
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
    nsx "$ns" ip addr add "10.210.0.$k/24" dev eth0
    nsx "$ns" ip link set eth0 up
done
nsx "$SW" nft -f - <<'EOF'
table bridge chaos {
    set a { type ipv4_addr; elements = { 10.210.0.1, 10.210.0.2 } }
    set b { type ipv4_addr; elements = { 10.210.0.3, 10.210.0.4, 10.210.0.5 } }
    chain forward {
        type filter hook forward priority 0;
    }
}
EOF

start_node() { # k
    local k=$1 peers=()
    # UDP first; the tcp:// listeners are announced, and carry the mesh while UDP is cut.
    [ "$k" -gt 1 ] && peers+=(-p udp://10.210.0.1:11010)
    [ "$k" -gt 2 ] && peers+=(-p udp://10.210.0.2:11010)
    ip netns exec "$TAG-n$k" "$WEFT" up --network-name soak --network-secret "soak secret" -i "10.211.0.$k/24" \
        -l udp://0.0.0.0:11010 -l tcp://0.0.0.0:11010 --threads 1 "${peers[@]}" \
        --state-dir "$WORK/n$k-state" --control "$WORK/n$k.sock" >>"$WORK/n$k.log" 2>&1 &
    PID[$k]=$!
}
for k in $(seq $N); do start_node "$k"; done
reach() { nsx "$TAG-n$1" ping -c 1 -W 1 "10.211.0.$2" >/dev/null 2>&1; }
# Seconds (0.2 s steps) until $1 pings $2, at most $3 s; prints the time or "never".
time_to_reach() {
    local from=$1 to=$2 limit=$3 start
    start=$(date +%s.%N)
    while ! reach "$from" "$to"; do
        if python3 -c "import sys,time; sys.exit(0 if time.time() - $start > $limit else 1)"; then
            echo never; return
        fi
        sleep 0.2
    done
    python3 -c "import time; print(f'{time.time() - $start:.1f}')"
}
for k in $(seq 2 $N); do
    t=$(time_to_reach 1 "$k" 60)
    [ "$t" != never ] || { echo "error: n$k never came up" >&2; tail "$WORK/n$k.log" >&2; exit 1; }
done
echo "mesh up" >&2

sample() { # label -> one JSON line per node
    for k in $(seq $N); do
        local p=${PID[$k]}
        [ -d "/proc/$p" ] || { echo "error: n$k (pid $p) is gone:" >&2; tail -5 "$WORK/n$k.log" >&2; exit 1; }
        python3 - "$1" "$k" "$p" <<'EOF'
import json, os, sys
label, k, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
st = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
print(json.dumps({"sample": label, "node": k, "pid": int(pid),
    "rss_kib": int(st["VmRSS"].split()[0]), "threads": int(st["Threads"]),
    "fds": len(os.listdir(f"/proc/{pid}/fd"))}))
EOF
    done >>"$WORK/samples.jsonl"
}
sleep 5
sample start

# Traffic: iperf3 n4 -> n5, and checksummed transfers n2 -> n3.
nsx "$TAG-n5" iperf3 -s >/dev/null 2>&1 &
BG+=("$!")
(
    end=$((SECONDS + DURATION))
    while [ $SECONDS -lt $end ]; do
        nsx "$TAG-n4" iperf3 -c 10.211.0.5 -t $((end - SECONDS > 5 ? end - SECONDS : 5)) -b 100M >/dev/null 2>&1 || sleep 1
    done
) &
BG+=("$!")
cat >"$WORK/xfer.py" <<'EOF'
# recv: python3 xfer.py recv ADDR PORT  -> prints "<bytes> <sha256>" per connection
# send: python3 xfer.py send ADDR PORT BYTES SEED -> prints "<bytes> <sha256>"
import hashlib, random, socket, sys
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(4)
    while True:
        c, _ = s.accept(); c.settimeout(120); h = hashlib.sha256(); n = 0
        try:
            while True:
                b = c.recv(1 << 16)
                if not b: break
                h.update(b); n += len(b)
            print(n, h.hexdigest(), flush=True)
        except OSError as e:
            print(n, "error", e, flush=True)
        c.close()
else:
    total, seed = int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed); h = hashlib.sha256(); n = 0
    s = socket.create_connection((addr, port), timeout=120)
    while n < total:
        b = rng.randbytes(min(1 << 16, total - n)); s.sendall(b); h.update(b); n += len(b)
    s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
    print(n, h.hexdigest(), flush=True)
EOF
nsx "$TAG-n3" python3 "$WORK/xfer.py" recv 10.211.0.3 5201 >"$WORK/recv.txt" 2>&1 &
BG+=("$!")
sleep 0.5
(
    end=$((SECONDS + DURATION)); i=0
    while [ $SECONDS -lt $end ]; do
        i=$((i + 1))
        nsx "$TAG-n2" python3 "$WORK/xfer.py" send 10.211.0.3 5201 $((8 << 20)) "$i" >>"$WORK/sent.txt" 2>/dev/null \
            || echo "0 failed" >>"$WORK/sent.txt"
    done
) &
BG+=("$!")

# Chaos, minute by minute.
EVENTS="$WORK/events.jsonl"
: >"$EVENTS"
t0=$SECONDS
victims=(3 4 5)
minute=0
at() { local target=$((t0 + minute * 60 + $1)); while [ $SECONDS -lt $target ]; do sleep 0.2; done; }
while [ $((minute * 60)) -lt "$DURATION" ]; do
    v=${victims[$((minute % 3))]}
    at 5
    kill -KILL "${PID[$v]}" 2>/dev/null || true
    wait "${PID[$v]}" 2>/dev/null || true
    start_node "$v"
    t=$(time_to_reach 1 "$v" 60)
    echo "{\"minute\": $minute, \"event\": \"restart\", \"node\": $v, \"reach_s\": \"$t\"}" >>"$EVENTS"
    [ $((minute * 60 + 20)) -lt "$DURATION" ] || break
    at 20
    nsx "$SW" nft add rule bridge chaos forward ip saddr @a ip daddr @b drop
    nsx "$SW" nft add rule bridge chaos forward ip saddr @b ip daddr @a drop
    at 30
    nsx "$SW" nft flush chain bridge chaos forward
    t=$(time_to_reach 1 4 60)
    t2=$(time_to_reach 4 1 60)
    echo "{\"minute\": $minute, \"event\": \"partition\", \"heal_s\": \"$t\", \"heal_back_s\": \"$t2\"}" >>"$EVENTS"
    [ $((minute * 60 + 40)) -lt "$DURATION" ] || break
    at 40
    nsx "$SW" nft add rule bridge chaos forward ip protocol udp drop
    at 50
    nsx "$SW" nft flush chain bridge chaos forward
    ok=$(reach 1 5 && echo true || echo false)
    echo "{\"minute\": $minute, \"event\": \"udp_blocked\", \"reached_during\": $ok}" >>"$EVENTS"
    minute=$((minute + 1))
done
at $((DURATION - minute * 60))
sample end
# Let the last transfer finish (or fail) before reading the results.
sleep 10

mkdir -p "$OUT"
python3 - "$WORK" "$OUT" "$DURATION" <<'EOF'
import json, os, platform, sys, time
work, out, duration = sys.argv[1], sys.argv[2], int(sys.argv[3])
events = [json.loads(l) for l in open(f"{work}/events.jsonl") if l.strip()]
samples = [json.loads(l) for l in open(f"{work}/samples.jsonl") if l.strip()]
sent = [l.split() for l in open(f"{work}/sent.txt") if l.strip()]
recv = [l.split() for l in open(f"{work}/recv.txt") if l.strip()]
done = [s for s in sent if len(s) >= 2 and s[1] != "failed"]
ok_recv = {(r[0], r[1]) for r in recv if len(r) == 2}
matched = [s for s in done if (s[0], s[1]) in ok_recv]
corrupt = [s for s in done if (s[0], s[1]) not in ok_recv]
failed = [s for s in sent if len(s) >= 2 and s[1] == "failed"]
restarts = [e for e in events if e["event"] == "restart"]
parts = [e for e in events if e["event"] == "partition"]
udp = [e for e in events if e["event"] == "udp_blocked"]
num = lambda v: float(v) if v != "never" else None
reach = [num(e["reach_s"]) for e in restarts]
heal = [max(num(e["heal_s"]) or 1e9, num(e["heal_back_s"]) or 1e9) for e in parts]
by = {(s["sample"], s["node"]): s for s in samples}
rows = []
for k in range(1, 6):
    a, b = by.get(("start", k)), by.get(("end", k))
    if a and b:
        same = a["pid"] == b["pid"]
        rows.append((k, a, b, same))
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
lines = [
    "# Soak and chaos", "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; "
    f"command `sudo DURATION={duration} bench/soak.sh`.", "",
    f"* Restarts (SIGKILL + start): {len(restarts)}; time until n1 pings the restarted node: "
    + ", ".join(f"{r:.1f} s" if r is not None else "never" for r in reach) + " (aim <= 10 s).",
    f"* Partitions healed: {len(parts)}; time until n1 and n4 ping each other again: "
    + ", ".join(f"{h:.1f} s" if h < 1e9 else "never" for h in heal) + " (aim <= 15 s).",
    f"* UDP blocked for 10 s: {len(udp)} times; n1 reached n5 over TCP meanwhile: "
    + ", ".join(str(e["reached_during"]).lower() for e in udp) + ".",
    f"* Checksummed 8 MiB transfers n2 -> n3: {len(matched)} completed and matched, {len(corrupt)} completed "
    f"but did not match, {len(failed)} failed (connection reset or timed out while its path was cut).",
    "", "| node | restarted | RSS start -> end MiB | threads | fds |", "|---|---|---|---|---|",
]
for k, a, b, same in rows:
    lines.append(f"| n{k} | {'no' if same else 'yes (new process)'} | {a['rss_kib']/1024:.1f} -> {b['rss_kib']/1024:.1f} | "
                 f"{a['threads']} -> {b['threads']} | {a['fds']} -> {b['fds']} |")
bad = bool(corrupt) or any(r is None for r in reach) or any(h >= 1e9 for h in heal)
lines += ["", "Verdict: " + ("FAILED (a corrupt transfer, a node never reached, or a partition never healed)" if bad else "ok")]
os.makedirs(out, exist_ok=True)
open(f"{out}/results.md", "w").write("\n".join(lines) + "\n")
json.dump({"events": events, "samples": samples, "transfers": {"matched": len(matched), "corrupt": len(corrupt),
           "failed": len(failed)}}, open(f"{out}/results.json", "w"), indent=1)
print("\n".join(lines))
sys.exit(3 if bad else 0)
EOF
