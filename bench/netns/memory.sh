#!/usr/bin/env bash
# Where a node's memory goes: two nodes over one transport, one iperf3 TCP stream B -> A,
# then each node's peak RSS under traffic and, by mapping (/proc/PID/smaps), how much
# of it is resident and how much was referenced during the traffic: the binary's code
# pages, the heap, other anonymous memory (thread stacks, the second malloc arena,
# quinn's receive buffer), libc.
#
#   A --veth-- B
#
#   sudo bench/netns/memory.sh                       # TRANSPORTS="udp tcp ws quic"
#   sudo TRANSPORTS="tcp" DURATION=6 bench/netns/memory.sh
#
# Environment: TRANSPORTS (udp tcp ws quic; default all four), DURATION (s of traffic,
# default 6), WEFT (default target/release/weft, built if missing), OUT (default
# bench/results/memory), MAX_RUNTIME (s; the script stops itself).
# Peak RSS is VmHWM after `clear_refs 5` at the start of the traffic (the 46 MiB
# Argon2id derivation at start is not counted); `clear_refs 1` at the same moment
# clears the referenced bits, so "referenced" is what the traffic itself touched.
# Namespaces are made here with unique names and removed on every exit path; neither
# has a default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-6}
TRANSPORTS=${TRANSPORTS:-udp tcp ws quic}
OUT=${OUT:-$ROOT/bench/results/memory}
NT=$(wc -w <<<"$TRANSPORTS")
MAX_RUNTIME=${MAX_RUNTIME:-$((NT * (DURATION + 40) + 60))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3)" >&2; exit 2; }
done
for t in $TRANSPORTS; do
    case "$t" in udp|tcp|ws|quic) ;; *) echo "error: transport $t: expected udp, tcp, ws or quic" >&2; exit 2 ;; esac
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wm$$"
A="$TAG-a"; B="$TAG-b"
WORK=$(mktemp -d /tmp/weft-memory-bench.XXXXXX)
PIDS=()
WEFTS=()
. "$HERE/procs.sh"
cleanup() {
    stop_all WEFTS
    stop_all PIDS
    for ns in "$A" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$B"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$TAG-ab" netns "$A" type veth peer name "$TAG-ba" netns "$B"
nsx "$A" ip addr add 198.51.100.1/24 dev "$TAG-ab"; nsx "$A" ip link set "$TAG-ab" up
nsx "$B" ip addr add 198.51.100.2/24 dev "$TAG-ba"; nsx "$B" ip link set "$TAG-ba" up

NET=(--network-name bench --network-secret "memory bench secret")
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    # Not through nsx: $! must be weft itself (ip netns exec execs it).
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >>"$WORK/$name.log" 2>&1 &
    WEFTS+=("$!")
}
# One line per node: transport node peak_kib rss_kib then name=rss:referenced (KiB) per
# mapping group.
snapshot() { # transport node pid
    WEFT_BIN=$(readlink -f "$WEFT") python3 - "$@" <<'EOF' >>"$WORK/mem.txt"
import os, re, sys
tr, node, pid = sys.argv[1:4]
status = open(f"/proc/{pid}/status").read()
field = lambda k: int(re.search(rf"^{k}:\s+(\d+)", status, re.M).group(1))
groups, name = {}, None
for line in open(f"/proc/{pid}/smaps"):
    if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
        parts = line.split()
        path = parts[5] if len(parts) > 5 else ""
        if path == os.environ["WEFT_BIN"]:
            name = "binary"
        elif path == "[heap]":
            name = "heap"
        elif path == "":
            name = "anon"
        elif "libc.so" in path or "libm.so" in path or "ld-linux" in path:
            name = "libc"
        else:
            name = "other"
        groups.setdefault(name, [0, 0])
    elif line.startswith("Rss:"):
        groups[name][0] += int(line.split()[1])
    elif line.startswith("Referenced:"):
        groups[name][1] += int(line.split()[1])
print(tr, node, field("VmHWM"), field("VmRSS"),
      " ".join(f"{k}={v[0]}:{v[1]}" for k, v in sorted(groups.items())))
EOF
}

: >"$WORK/mem.txt"
for t in $TRANSPORTS; do
    case "$t" in udp|tcp) port=11010 ;; ws) port=11011 ;; quic) port=11012 ;; esac
    peer="$t://198.51.100.1:$port"; [ "$t" = ws ] && peer="$peer/"
    start_weft "$A" a -i 10.200.0.1/24 -l "$t://0.0.0.0:$port"
    start_weft "$B" b -i 10.200.0.2/24 -l "$t://0.0.0.0:$port" -p "$peer"
    ok=0
    for _ in $(seq 100); do nsx "$B" ping -c 1 -W 1 10.200.0.1 >/dev/null 2>&1 && { ok=1; break; }; sleep 0.2; done
    [ "$ok" = 1 ] || { echo "error: no tunnel over $t" >&2; tail -20 "$WORK/b.log" >&2; exit 1; }
    nsx "$A" iperf3 -s -1 -D --pidfile "$WORK/iperf3.pid" >/dev/null
    sleep 0.5
    PIDS+=("$(cat "$WORK/iperf3.pid")")
    for pid in "${WEFTS[@]}"; do echo 5 >"/proc/$pid/clear_refs"; echo 1 >"/proc/$pid/clear_refs"; done
    j=$(nsx "$B" iperf3 -c 10.200.0.1 -t "$DURATION" -J 2>/dev/null || true)
    gbps=$(python3 -c 'import json,sys; print("%.2f" % (json.loads(sys.argv[1])["end"]["sum_received"]["bits_per_second"] / 1e9))' "$j" 2>/dev/null || echo failed)
    echo "$t $gbps" >>"$WORK/gbps.txt"
    snapshot "$t" "A (receiver)" "${WEFTS[0]}"
    snapshot "$t" "B (sender)" "${WEFTS[1]}"
    stop_all WEFTS
    rm -rf "$WORK"/{a,b}-state
done

mkdir -p "$OUT"
python3 - "$WORK/mem.txt" "$WORK/gbps.txt" "$OUT" "$DURATION" "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo ?)" "$("$WEFT" --version)" <<'EOF'
import os, platform, sys, time
mem_path, gbps_path, out, duration, head, version = sys.argv[1:7]
gbps = dict(l.split() for l in open(gbps_path) if l.strip())
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
mib = lambda k: f"{int(k) / 1024:.1f}"
lines = [
    "# Where a node's memory goes",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; {version}.",
    f"Command: `sudo DURATION={duration} bench/netns/memory.sh`; one iperf3 TCP stream B -> A for {duration} s per transport.",
    "MiB resident / of it referenced during the traffic, per mapping group.",
    "",
    "| transport | node | Gbit/s | peak RSS | RSS after | binary code | heap | other anonymous | libc |",
    "|---|---|---|---|---|---|---|---|---|",
]
for l in open(mem_path):
    tr, rest = l.split(" ", 1)
    node, rest = rest.split(")", 1)
    hwm, rss, *groups = rest.split()
    g = {k: v.split(":") for k, v in (x.split("=") for x in groups)}
    cell = lambda k: f"{mib(g[k][0])} / {mib(g[k][1])}" if k in g else "-"
    lines.append(f"| {tr} | {node}) | {gbps.get(tr, '-')} | {mib(hwm)} | {mib(rss)} | {cell('binary')} | {cell('heap')} | {cell('anon')} | {cell('libc')} |")
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
