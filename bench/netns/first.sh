#!/usr/bin/env bash
# The first packet to an idle member: how long a ping waits when there is no session
# yet (the engine queues it, makes one, then sends it), direct and relayed, against
# the same pair's later pings.
#
#            +-- A (192.0.2.1)          A, B and D share a LAN (a bridge in namespace
#   bridge --+-- B (192.0.2.2) -- C     S); C reaches only B (198.51.100.0/24), which
#            +-- D (192.0.2.4)          does not forward IP: A -> C is relayed by B.
#
# A, C and D dial B alone. Each round starts A afresh (its node key kept), waits until
# it knows C and D from their records (idle: no session), then pings D once (direct),
# C once (relayed), and each of them PINGS more times for the steady state. A's stop
# says goodbye, so the next round begins without sessions again.
#
#   sudo bench/netns/first.sh                    # ROUNDS=10
#   sudo ROUNDS=3 bench/netns/first.sh
#
# Environment: ROUNDS (default 10), PINGS (later pings per round, default 5), TRANSPORT
# (udp, tcp or ws; default udp), WEFT (binary; default target/release/weft, built if
# missing), OUT (default bench/results/first), MAX_RUNTIME (s; the script stops itself).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ROUNDS=${ROUNDS:-10}
PINGS=${PINGS:-5}
TRANSPORT=${TRANSPORT:-udp}
OUT=${OUT:-$ROOT/bench/results/first}
MAX_RUNTIME=${MAX_RUNTIME:-$((ROUNDS * 30 + 120))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip ping python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iputils-ping python3)" >&2; exit 2; }
done
case "$ROUNDS$PINGS" in *[!0-9]*) echo "error: ROUNDS and PINGS must be whole numbers" >&2; exit 2 ;; esac
[ "$ROUNDS" -ge 1 ] && [ "$PINGS" -ge 1 ] || { echo "error: ROUNDS and PINGS must be at least 1" >&2; exit 2; }
case "$TRANSPORT" in
    udp | tcp) PORT=11010 ;;
    ws) PORT=11011 ;;
    *) echo "error: TRANSPORT $TRANSPORT: expected udp, tcp or ws" >&2; exit 2 ;;
esac
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wf$$"
S="$TAG-s"; A="$TAG-a"; B="$TAG-b"; C="$TAG-c"; D="$TAG-d"
WORK=$(mktemp -d /tmp/weft-first-bench.XXXXXX)
PIDS=()
WEFTS=()
A_PID=""
IN_CLEANUP=0
. "$HERE/procs.sh"
cleanup() {
    IN_CLEANUP=1
    kill_pid "$A_PID"
    stop_all WEFTS
    stop_all PIDS
    remove_netns "$A" "$B" "$C" "$D" "$S"
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
start_watchdog
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
make_netns "$S" "$A" "$B" "$C" "$D"
nsx "$S" ip link add br0 type bridge
nsx "$S" ip link set br0 up
n=1
for ns in "$A" "$B" "$D"; do
    case $ns in "$A") host=1 ;; "$B") host=2 ;; "$D") host=4 ;; esac
    ip link add "$TAG-$n" netns "$ns" type veth peer name "$TAG-p$n" netns "$S"
    nsx "$S" ip link set "$TAG-p$n" master br0 up
    nsx "$ns" ip addr add "192.0.2.$host/24" dev "$TAG-$n"
    nsx "$ns" ip link set "$TAG-$n" up
    n=$((n + 1))
done
ip link add "$TAG-bc" netns "$B" type veth peer name "$TAG-cb" netns "$C"
nsx "$B" ip addr add 198.51.100.2/24 dev "$TAG-bc"; nsx "$B" ip link set "$TAG-bc" up
nsx "$C" ip addr add 198.51.100.3/24 dev "$TAG-cb"; nsx "$C" ip link set "$TAG-cb" up
nsx "$B" sysctl -qw net.ipv4.ip_forward=0

NET=(--network-name bench --network-secret "first packet bench secret" --threads 1)
start_weft() { # ns name args... (prints nothing; the PID goes to LAST_PID)
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" \
        -l "$TRANSPORT://0.0.0.0:$PORT" "$@" >>"$WORK/$name.log" 2>&1 &
    LAST_PID=$!
}
start_weft "$B" b -i 10.126.126.2/24
WEFTS+=("$LAST_PID")
sleep 0.3
start_weft "$C" c -i 10.126.126.3/24 -p "$TRANSPORT://198.51.100.2:$PORT"
WEFTS+=("$LAST_PID")
start_weft "$D" d -i 10.126.126.4/24 -p "$TRANSPORT://192.0.2.2:$PORT"
WEFTS+=("$LAST_PID")

# A's view of the member at $1: "state path" from its status (nothing when unknown or
# while A's control socket is not up yet).
peer_view() {
    "$WEFT" peers --json --control "$WORK/a.sock" 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
for p in (d['peers'] if isinstance(d, dict) else d):
    if p['overlay'] == sys.argv[1]:
        print(p['state'], p['path'])" "$1" 2>/dev/null || true
}
rtt() { # ns dst count -> one round-trip time per line (ms), lost ones left out
    nsx "$1" ping -n -c "$3" -i 0.2 -W 3 "$2" 2>/dev/null | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' || true
}

RUNS="$WORK/runs.jsonl"
: >"$RUNS"
for round in $(seq "$ROUNDS"); do
    start_weft "$A" a -i 10.126.126.1/24 -p "$TRANSPORT://192.0.2.2:$PORT"
    A_PID=$LAST_PID
    ready=0
    for _ in $(seq 200); do
        c=$(peer_view 10.126.126.3); d=$(peer_view 10.126.126.4)
        # Known from their records, and no session yet.
        if [ "${c%% *}" = idle ] && [ "${d%% *}" = idle ]; then ready=1; break; fi
        sleep 0.1
    done
    [ "$ready" = 1 ] || { echo "error: round $round: A never saw C and D idle (C: ${c:-unknown}, D: ${d:-unknown})" >&2; tail -20 "$WORK/a.log" >&2; exit 1; }
    first_d=$(rtt "$A" 10.126.126.4 1)
    first_c=$(rtt "$A" 10.126.126.3 1)
    path_d=$(peer_view 10.126.126.4); path_c=$(peer_view 10.126.126.3)
    later_d=$(rtt "$A" 10.126.126.4 "$PINGS" | tr '\n' ' ')
    later_c=$(rtt "$A" 10.126.126.3 "$PINGS" | tr '\n' ' ')
    python3 - "$round" "$first_d" "$first_c" "$later_d" "$later_c" "$path_d" "$path_c" >>"$RUNS" <<'EOF'
import json, sys
r, fd, fc, ld, lc, pd, pc = sys.argv[1:8]
f = lambda s: float(s) if s.strip() else None
print(json.dumps({"round": int(r), "first_direct": f(fd), "first_relayed": f(fc),
                  "later_direct": [float(x) for x in ld.split()], "later_relayed": [float(x) for x in lc.split()],
                  "path_direct": pd, "path_relayed": pc}))
EOF
    tail -1 "$RUNS" >&2
    kill_pid "$A_PID"
    A_PID=""
    sleep 0.5
done

mkdir -p "$OUT"
cp "$RUNS" "$OUT/runs.jsonl"
python3 - "$RUNS" "$OUT" "$ROUNDS" "$PINGS" "$TRANSPORT" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, rounds, pings, transport = sys.argv[1:6]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
def stats(key):
    v = []
    for r in runs:
        x = r[key]
        v += x if isinstance(x, list) else ([x] if x is not None else [])
    if not v:
        return "–", "–", "–", 0
    v.sort()
    p95 = v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]
    return f"{statistics.median(v):.2f}", f"{p95:.2f}", f"{max(v):.2f}", len(v)
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
lost_d = sum(1 for r in runs if r["first_direct"] is None)
lost_c = sum(1 for r in runs if r["first_relayed"] is None)
lines = [
    "# The first packet to an idle member",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo ROUNDS={rounds} PINGS={pings} TRANSPORT={transport} bench/netns/first.sh`; "
    "A restarted each round (no session with C or D), one ping to each, then the later pings.",
    "",
    "| ping from A | median ms | p95 ms | max ms | samples |",
    "|---|---|---|---|---|",
]
for label, key in [("first, to D (on A's LAN)", "first_direct"), ("later, to D", "later_direct"),
                   ("first, to C (relayed by B)", "first_relayed"), ("later, to C", "later_relayed")]:
    m, p, x, n = stats(key)
    lines.append(f"| {label} | {m} | {p} | {x} | {n} |")
lines += ["", f"First pings lost (no answer within 3 s): direct {lost_d}, relayed {lost_c} of {len(runs)}.",
          f"Paths A saw after the first ping: D {sorted(set(r['path_direct'] for r in runs))}, "
          f"C {sorted(set(r['path_relayed'] for r in runs))}."]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
