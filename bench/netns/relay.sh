#!/usr/bin/env bash
# Relayed throughput: A and C share no link and no route; both dial B, which relays
# their sealed frames without opening them. Single TCP stream A -> C through B against
# Weft's direct A -> B in the same run, per transport of the two hops (udp, tcp, ws),
# and the bare veth A -> B.
#
#   A --veth-- B --veth-- C        (B does not forward IP: only Weft crosses it)
#
#   sudo bench/netns/relay.sh                      # REPS=3, DURATION=10, udp tcp ws
#   sudo REPS=1 DURATION=3 TRANSPORTS="udp" bench/netns/relay.sh
#   sudo LATENCY=1 bench/netns/relay.sh            # round trips instead (latency.sh's)
#
# Environment: DURATION (s per run, default 10), REPS (default 3), TRANSPORTS (default
# "udp tcp ws"), WEFT (binary; default target/release/weft, built if missing), OUT
# (default bench/results/relay, or bench/results/relay-latency with LATENCY=1),
# MAX_RUNTIME (s; the script stops itself). Throughput runs use --threads 1 on each
# node, latency runs the default. LATENCY=1 measures, per row, what
# latency.sh does: PINGS (default 500) pings 10 ms apart idle, then one iperf3 stream
# for DURATION s with pings and the game flow beside it, all from A (to B over the bare
# veth and Weft's direct hop, to C through B) — latency.md, latency.json, latency.svg.
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-10}
REPS=${REPS:-3}
TRANSPORTS=${TRANSPORTS:-udp tcp ws}
LATENCY=${LATENCY:-0}
PINGS=${PINGS:-500}
case "$DURATION$REPS$PINGS" in *[!0-9]*) echo "error: DURATION, REPS and PINGS must be whole numbers" >&2; exit 2 ;; esac
if [ "$LATENCY" = 1 ]; then OUT=${OUT:-$ROOT/bench/results/relay-latency}; else OUT=${OUT:-$ROOT/bench/results/relay}; fi
NT=$(wc -w <<<"$TRANSPORTS")
PER_RUN=$((DURATION + 5))
[ "$LATENCY" = 1 ] && PER_RUN=$((DURATION + PINGS / 100 + 10))
MAX_RUNTIME=${MAX_RUNTIME:-$((NT * (REPS * 2 * PER_RUN + 60) + REPS * PER_RUN + 120))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 python3)" >&2; exit 2; }
done
if [ "$LATENCY" = 1 ] && { [ "$DURATION" -lt 3 ] || [ "$PINGS" -lt 1 ]; }; then
    echo "error: LATENCY=1 needs DURATION >= 3 (pings start a second in and stop a second early) and PINGS >= 1" >&2; exit 2
fi
for t in $TRANSPORTS; do
    case "$t" in udp|tcp|ws) ;; *) echo "error: transport $t: expected udp, tcp or ws" >&2; exit 2 ;; esac
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wr$$"
A="$TAG-a"; B="$TAG-b"; C="$TAG-c"
WORK=$(mktemp -d /tmp/weft-relay-bench.XXXXXX)
PIDS=()
WEFTS=()
. "$HERE/procs.sh"
cleanup() {
    stop_all WEFTS
    stop_all PIDS
    for ns in "$A" "$B" "$C"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
start_watchdog   # its sleep goes with it: a leftover one held a caller's pipe open
PIDS+=("$WATCHDOG_PID")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$A" "$B" "$C"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$TAG-ab" netns "$A" type veth peer name "$TAG-ba" netns "$B"
ip link add "$TAG-bc" netns "$B" type veth peer name "$TAG-cb" netns "$C"
nsx "$A" ip addr add 192.0.2.1/24 dev "$TAG-ab"; nsx "$A" ip link set "$TAG-ab" up
nsx "$B" ip addr add 192.0.2.2/24 dev "$TAG-ba"; nsx "$B" ip link set "$TAG-ba" up
nsx "$B" ip addr add 198.51.100.2/24 dev "$TAG-bc"; nsx "$B" ip link set "$TAG-bc" up
nsx "$C" ip addr add 198.51.100.3/24 dev "$TAG-cb"; nsx "$C" ip link set "$TAG-cb" up
nsx "$B" sysctl -qw net.ipv4.ip_forward=0

for ns in "$B" "$C"; do nsx "$ns" iperf3 -s -D --pidfile "$WORK/iperf3-$ns.pid" >/dev/null; done
sleep 0.5
for ns in "$B" "$C"; do PIDS+=("$(cat "$WORK/iperf3-$ns.pid")"); done
LATENCY_PY=$HERE/latency.py
if [ "$LATENCY" = 1 ]; then
    # The game flow's echo (latency.sh's), on both targets.
    for ns in "$B" "$C"; do
        nsx "$ns" python3 "$LATENCY_PY" echo 9000 >"$WORK/echo-$ns.log" 2>&1 &
        PIDS+=("$!")
    done
fi

RUNS="$WORK/runs.jsonl"
: >"$RUNS"
LAT_N=0
# One latency row (LATENCY=1): as latency.sh's measure_latency, from A.
lat_run() { # row ns target rep
    local row=$1 ns=$2 dst=$3 rep=$4 base bulk game rc=0
    LAT_N=$((LAT_N + 1)); base="$WORK/lat-$LAT_N"
    nsx "$ns" ping -i 0.01 -W 1 -c "$PINGS" "$dst" >"$base.idle" 2>&1 || true
    nsx "$ns" iperf3 -c "$dst" -J -t "$DURATION" --connect-timeout 5000 >"$base.iperf" 2>"$base.iperf.err" &
    bulk=$!
    sleep 1
    nsx "$ns" python3 "$LATENCY_PY" game "$dst" 9000 "$((DURATION - 2))" "$base.game" &
    game=$!
    nsx "$ns" ping -i 0.01 -W 1 -c "$(((DURATION - 2) * 100))" "$dst" >"$base.loaded" 2>&1 || true
    wait "$game" 2>/dev/null || true
    wait "$bulk" 2>/dev/null || rc=$?
    local tool=${row%% *} mode=${row#* }
    python3 "$LATENCY_PY" record --rep "$rep" --tool "$tool" --mode "$mode" --idle "$base.idle" \
        --loaded "$base.loaded" --game "$base.game" --iperf "$base.iperf" \
        --note "$([ "$rc" = 0 ] || echo "iperf3 exited $rc")" >>"$RUNS"
    tail -n1 "$RUNS" | python3 "$LATENCY_PY" line >&2 || true
}
# The relay's resident memory while it relays, sampled every 0.5 s (VmHWM would report
# the 46 MiB Argon2id derivation of the key at start, freed at once).
RELAY_PID=""
rss_watch() {
    local max=0 v
    while sleep 0.5; do
        v=$(awk '/VmRSS/ {print $2}' "/proc/$RELAY_PID/status" 2>/dev/null || echo 0)
        [ "${v:-0}" -gt "$max" ] && { max=$v; echo "$max" >"$WORK/rss-now"; }
    done
}
# CPU time (user + system, clock ticks) of each node's process, A B C, across a run.
NODE_PIDS=()
node_ticks() {
    local p
    # "-" for a node that is not there (no CPU figure for that run, rather than 0).
    for p in "${NODE_PIDS[@]}"; do
        { [ -n "$p" ] && awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; } || echo -
    done | tr '\n' ' '
}
run() { # row ns target
    local row=$1 ns=$2 dst=$3 j before after t0 t1
    before=$(node_ticks); t0=$(date +%s.%N)
    j=$(nsx "$ns" iperf3 -c "$dst" -t "$DURATION" -J 2>/dev/null || true)
    after=$(node_ticks); t1=$(date +%s.%N)
    python3 - "$row" "$j" "$before" "$after" "$t0" "$t1" "$(getconf CLK_TCK)" >>"$RUNS" <<'EOF'
import json, sys
row, text, before, after, t0, t1, tck = sys.argv[1:8]
try:
    end = json.loads(text)["end"]
    cpu = end.get("cpu_utilization_percent", {})
    rec = {"row": row, "gbps": end["sum_received"]["bits_per_second"] / 1e9,
           "retransmits": end.get("sum_sent", {}).get("retransmits", 0),
           "cpu_host": cpu.get("host_total"), "cpu_remote": cpu.get("remote_total")}
except Exception as e:
    print(json.dumps({"row": row, "error": str(e)}))
    sys.exit(0)
b, a = before.split(), after.split()
if b and len(a) == len(b) and "-" not in a + b and all(int(y) >= int(x) for x, y in zip(b, a)):
    # Each node's share of one CPU over the run's wall time, A B C.
    wall = float(t1) - float(t0)
    rec["cpu_nodes"] = [(int(y) - int(x)) / int(tck) / wall * 100 for x, y in zip(b, a)]
print(json.dumps(rec))
EOF
    tail -1 "$RUNS" >&2
}

# Throughput per core: one pipeline per node. Latency as users run it: the default
# (a pipeline per core, sparse flows steered to their own).
NET=(--network-name bench --network-secret "relay bench secret")
[ "$LATENCY" = 1 ] || NET+=(--threads 1)
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    # Not through nsx: $! must be weft itself (ip netns exec execs it), not a subshell,
    # so that stop_all WEFTS really stops it between transports.
    ip netns exec "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >>"$WORK/$name.log" 2>&1 &
    WEFTS+=("$!")
}
peer_path() { # sock overlay -> path transport
    "$WEFT" peers --json --control "$1" 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
for p in (d['peers'] if isinstance(d, dict) else d):
    if p['overlay'] == sys.argv[1]:
        print(p['path'], p['transport'])" "$2"
}
RSS="$WORK/rss.txt"
: >"$RSS"
for rep in $(seq "$REPS"); do
    if [ "$LATENCY" = 1 ]; then lat_run "direct veth A->B" "$A" 192.0.2.2 "$rep"; else run "veth A->B" "$A" 192.0.2.2; fi
done
for t in $TRANSPORTS; do
    case "$t" in udp|tcp) port=11010 ;; ws) port=11011 ;; esac
    start_weft "$B" b -i 10.126.126.2/24 -l "$t://0.0.0.0:$port"
    sleep 0.3
    start_weft "$A" a -i 10.126.126.1/24 -l "$t://0.0.0.0:$port" -p "$t://192.0.2.2:$port"
    start_weft "$C" c -i 10.126.126.3/24 -l "$t://0.0.0.0:$port" -p "$t://198.51.100.2:$port"
    ok=0
    for _ in $(seq 150); do
        if nsx "$A" ping -c 1 -W 1 10.126.126.3 >/dev/null 2>&1 && nsx "$A" ping -c 1 -W 1 10.126.126.2 >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.2
    done
    [ "$ok" = 1 ] || { echo "error: A never reached C over $t" >&2; tail -20 "$WORK/a.log" >&2; exit 1; }
    path=$(peer_path "$WORK/a.sock" 10.126.126.3)
    hop=$(peer_path "$WORK/a.sock" 10.126.126.2)
    echo "$t: A sees C as: $path; B as: $hop" >&2
    case "$path" in relay*) ;; *) echo "error: A -> C is not relayed ($path)" >&2; exit 1 ;; esac
    [ "$hop" = "direct $t" ] || { echo "error: A -> B is not direct over $t ($hop)" >&2; exit 1; }
    # start_weft's $! is weft itself, in start order B, A, C.
    RELAY_PID=${WEFTS[0]}
    NODE_PIDS=("${WEFTS[1]}" "$RELAY_PID" "${WEFTS[2]}")
    echo 0 >"$WORK/rss-now"
    rss_watch &
    WATCH=$!
    PIDS+=("$WATCH")
    for rep in $(seq "$REPS"); do
        if [ "$LATENCY" = 1 ]; then
            lat_run "weft $t A->B direct" "$A" 10.126.126.2 "$rep"
            lat_run "weft $t A->C via B" "$A" 10.126.126.3 "$rep"
        else
            run "weft $t A->B direct" "$A" 10.126.126.2
            run "weft $t A->C via B" "$A" 10.126.126.3
        fi
    done
    kill "$WATCH" 2>/dev/null || true
    wait "$WATCH" 2>/dev/null || true
    echo "$t $(cat "$WORK/rss-now")" >>"$RSS"
    NODE_PIDS=()
    stop_all WEFTS
    rm -rf "$WORK"/{a,b,c}-state
done

mkdir -p "$OUT"
if [ "$LATENCY" = 1 ]; then
    {
        echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "cmdline=LATENCY=1 REPS=$REPS DURATION=$DURATION PINGS=$PINGS TRANSPORTS=\"$TRANSPORTS\" bench/netns/relay.sh"
        echo "nproc=$(nproc)"
        echo "kernel=$(uname -srm)"
        echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
        echo "reps=$REPS"; echo "duration=$DURATION"
        echo "direction=A -> B (direct) and A -> C (relayed by B)"
        echo "version.weft=$("$WEFT" --version 2>/dev/null | head -n1)"
    } >"$WORK/meta.txt"
    python3 "$LATENCY_PY" report --runs "$RUNS" --meta "$WORK/meta.txt" --out "$OUT"
    cat "$OUT/latency.md"
    exit 0
fi
python3 - "$RUNS" "$OUT" "$DURATION" "$REPS" "$RSS" "$TRANSPORTS" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, duration, reps, rss_path, transports = sys.argv[1:7]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
def med(row, key="gbps"):
    v = [x[key] for x in runs if x["row"] == row and key in x and x[key] is not None]
    return statistics.median(v) if v else None
info = open("/proc/cpuinfo").read()
cpu = info.split("model name")[1].split("\n")[0].strip(": \t") if "model name" in info else "?"
rss = dict(l.split() for l in open(rss_path) if l.strip())
veth = med("veth A->B")
lines = [
    "# Relayed throughput",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo REPS={reps} DURATION={duration} TRANSPORTS=\"{transports}\" bench/netns/relay.sh`; single TCP stream (iperf3), medians of {reps} runs of {duration} s; aes-128-gcm, --threads 1.",
    "A and C have no link and no route to each other; B relays their sealed frames (it never opens them).",
    "",
    f"veth A->B (no tunnel): {veth:.2f} Gbit/s." if veth else "veth A->B: failed.",
    "",
    "| hops over | direct A->B Gbit/s | relayed A->C Gbit/s | relayed / direct | retransmits relayed | relay (B) RSS under load MiB | CPU % A / B / C, relayed | B's CPU % per Gbit/s |",
    "|---|---|---|---|---|---|---|---|",
]
def cpus(row):
    v = [x["cpu_nodes"] for x in runs if x["row"] == row and x.get("cpu_nodes")]
    return [statistics.median(c) for c in zip(*v)] if v else None
def per_gbit(row, i):
    v = [x["cpu_nodes"][i] / x["gbps"] for x in runs if x["row"] == row and x.get("cpu_nodes") and x.get("gbps")]
    return statistics.median(v) if v else None
for t in transports.split():
    d, r = med(f"weft {t} A->B direct"), med(f"weft {t} A->C via B")
    retr = med(f"weft {t} A->C via B", "retransmits")
    ratio = f"{r / d:.2f}x" if d and r else "-"
    f = lambda v: f"{v:.2f}" if v is not None else "failed"
    c, g = cpus(f"weft {t} A->C via B"), per_gbit(f"weft {t} A->C via B", 1)
    cs = " / ".join(f"{x:.0f}" for x in c) if c else "-"
    gs = f"{g:.1f}" if g is not None else "-"
    lines.append(f"| {t} | {f(d)} | {f(r)} | {ratio} | {retr if retr is not None else '-'} | {int(rss.get(t, 0)) / 1024:.1f} | {cs} | {gs} |")
vc = [(x["cpu_host"] + x["cpu_remote"]) / x["gbps"] for x in runs
      if x["row"] == "veth A->B" and x.get("gbps") and x.get("cpu_host") is not None and x.get("cpu_remote") is not None]
lines += ["", "CPU %: each node's process (user + system) as a share of one CPU over the run, medians; "
          "what softirqs run in other tasks' time is not in it."]
if vc:
    lines.append(f"For scale, both iperf3 ends over the bare veth (a TCP connection sent and received) cost "
                 f"{statistics.median(vc):.1f} % per Gbit/s (iperf3's own figures).")
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
json.dump({"runs": runs}, open(os.path.join(out, "results.json"), "w"), indent=1)
print("\n".join(lines))
EOF
