#!/usr/bin/env bash
# WireGuard portal throughput: a stock WireGuard client (wireguard-go from Debian, set up
# from the config `weft wg add` prints) reaching a mesh member through a portal member,
# against Weft's own direct path between the two members and the bare veth, in the
# same run.
#
#   W (wireguard-go) --veth-- P (weft --wg-portal) --veth-- A (weft)
#
#   sudo bench/netns/portal.sh            # REPS=3, DURATION=10
#   sudo REPS=1 DURATION=3 bench/netns/portal.sh
#
# Rows (single TCP stream, iperf3): veth P->A (baseline), weft P->A (overlay, direct),
# portal W->A (client to member), portal A->W (member to client, iperf3 -R).
# Environment: DURATION (s per run, default 10), REPS (default 3), WEFT (binary; default
# target/release/weft, built if missing), OUT (default bench/results/portal),
# MAX_RUNTIME (s; the script stops itself, default from the plan).
# Namespaces are made here with unique names and removed on every exit path; none has a
# default route, so nothing leaves them.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-10}
REPS=${REPS:-3}
OUT=${OUT:-$ROOT/bench/results/portal}
MAX_RUNTIME=${MAX_RUNTIME:-$((REPS * 4 * (DURATION + 10) + 120))}

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (network namespaces, TUN devices)" >&2; exit 2; }
for t in ip iperf3 wireguard-go wg python3; do
    command -v "$t" >/dev/null || { echo "error: $t missing (apt install iproute2 iperf3 wireguard-go wireguard-tools python3)" >&2; exit 2; }
done
if [ -z "${WEFT:-}" ]; then
    WEFT=$ROOT/target/release/weft
    [ -x "$WEFT" ] || (cd "$ROOT" && cargo build --release -p weft)
fi

TAG="wp$$"
WGIF="wgb$$"
W="$TAG-w"; P="$TAG-p"; A="$TAG-a"
WORK=$(mktemp -d /tmp/weft-portal-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    # Whatever still runs inside our namespaces (the iperf3 daemon) is ours.
    for ns in "$W" "$P" "$A"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    # wireguard-go's control socket lives outside the namespace.
    rm -f "/var/run/wireguard/$WGIF.sock"
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
# Stop ourselves after MAX_RUNTIME whatever happens.
. "$HERE/procs.sh"
start_watchdog   # its sleep goes with it: a leftover one held a caller's pipe open
WATCHDOG=$WATCHDOG_PID
PIDS+=("$WATCHDOG")

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in "$W" "$P" "$A"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$TAG-wp" netns "$W" type veth peer name "$TAG-pw" netns "$P"
ip link add "$TAG-pa" netns "$P" type veth peer name "$TAG-ap" netns "$A"
nsx "$W" ip addr add 203.0.113.2/24 dev "$TAG-wp"; nsx "$W" ip link set "$TAG-wp" up
nsx "$P" ip addr add 203.0.113.1/24 dev "$TAG-pw"; nsx "$P" ip link set "$TAG-pw" up
nsx "$P" ip addr add 192.0.2.1/24 dev "$TAG-pa"; nsx "$P" ip link set "$TAG-pa" up
nsx "$A" ip addr add 192.0.2.2/24 dev "$TAG-ap"; nsx "$A" ip link set "$TAG-ap" up

NET=(--network-name bench --network-secret "portal bench secret" -l udp://0.0.0.0:11010)
start_weft() { # ns name args...
    local ns=$1 name=$2; shift 2
    nsx "$ns" "$WEFT" up "${NET[@]}" --state-dir "$WORK/$name-state" --control "$WORK/$name.sock" "$@" \
        >"$WORK/$name.log" 2>&1 &
    PIDS+=("$!")
}
start_weft "$P" p -i 10.126.126.1/24 --wg-portal udp://0.0.0.0:51820 --wg-portal-net 10.127.0.0/24 \
    --wg-portal-endpoint 203.0.113.1:51820
start_weft "$A" a -i 10.126.126.2/24 -p udp://192.0.2.1:11010
for _ in $(seq 100); do
    "$WEFT" status --control "$WORK/p.sock" >/dev/null 2>&1 && break; sleep 0.1
done
"$WEFT" wg add bench --control "$WORK/p.sock" >"$WORK/wgb.conf"
# wg-quick's work by hand, with wireguard-go in the foreground as our own child.
WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1 nsx "$W" wireguard-go -f "$WGIF" >"$WORK/wireguard-go.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do nsx "$W" wg show "$WGIF" >/dev/null 2>&1 && break; sleep 0.1; done
wg-quick strip "$WORK/wgb.conf" >"$WORK/wgb.wg"
nsx "$W" wg setconf "$WGIF" "$WORK/wgb.wg"
conf() { sed -n "s/^$1 = //p" "$WORK/wgb.conf"; }
nsx "$W" ip addr add "$(conf Address)" dev "$WGIF"
nsx "$W" ip link set "$WGIF" mtu "$(conf MTU)" up
for n in $(conf AllowedIPs | tr -d ' ' | tr ',' ' '); do nsx "$W" ip route add "$n" dev "$WGIF"; done
ok=0
for _ in $(seq 100); do
    if nsx "$W" ping -c 1 -W 1 10.126.126.2 >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.2
done
[ "$ok" = 1 ] || { echo "error: the client never reached A through the portal" >&2; tail -20 "$WORK/p.log" >&2; exit 1; }

nsx "$A" iperf3 -s -D --pidfile "$WORK/iperf3.pid" >/dev/null
sleep 0.5
PIDS+=("$(cat "$WORK/iperf3.pid")")
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
run() { # row ns target [extra iperf3 args]
    local row=$1 ns=$2 dst=$3; shift 3
    local j
    j=$(nsx "$ns" iperf3 -c "$dst" -t "$DURATION" -J "$@" 2>/dev/null || true)
    python3 - "$row" "$j" >>"$RUNS" <<'EOF'
import json, sys
row, text = sys.argv[1], sys.argv[2]
try:
    d = json.loads(text)
    end = d["end"]
    bps = end["sum_received"]["bits_per_second"]
    retr = end.get("sum_sent", {}).get("retransmits", 0)
    cpu = end.get("cpu_utilization_percent", {})
    print(json.dumps({"row": row, "gbps": bps / 1e9, "retransmits": retr,
                      "cpu_host": cpu.get("host_total"), "cpu_remote": cpu.get("remote_total")}))
except Exception as e:
    print(json.dumps({"row": row, "error": str(e)}))
EOF
    tail -1 "$RUNS" >&2
}
# The portal's peak from here on, under traffic: without the reset, VmHWM reported the
# 46 MiB Argon2id derivation at start (freed at once).
PORTAL_PID=$(pgrep -f "$WORK/p.sock" | head -1)
echo 5 >"/proc/$PORTAL_PID/clear_refs"
for rep in $(seq "$REPS"); do
    echo "rep $rep/$REPS" >&2
    run "veth P->A" "$P" 192.0.2.2
    run "weft P->A" "$P" 10.126.126.2
    run "portal W->A" "$W" 10.126.126.2
    run "portal A->W" "$W" 10.126.126.2 -R
done
"$WEFT" wg list --control "$WORK/p.sock" >"$WORK/wg-list.txt" || true
# Where datagrams were lost: UDP receive-buffer overflows in each namespace.
for ns in "$W" "$P" "$A"; do
    echo "${ns#"$TAG"-} $(nsx "$ns" nstat -az UdpRcvbufErrors 2>/dev/null | awk '/UdpRcvbufErrors/ {print $2}')"
done >"$WORK/rcvbuf.txt"
RSS_P=$(awk '/VmHWM/ {print $2}' "/proc/$PORTAL_PID/status" 2>/dev/null || echo 0)

mkdir -p "$OUT"
python3 - "$RUNS" "$OUT" "$DURATION" "$REPS" "$RSS_P" "$WORK/wg-list.txt" "$WORK/rcvbuf.txt" <<'EOF'
import json, os, platform, statistics, sys, time
runs_path, out, duration, reps, rss, wg_list, rcvbuf = sys.argv[1:8]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
rows = ["veth P->A", "weft P->A", "portal W->A", "portal A->W"]
med = {}
for r in rows:
    v = [x["gbps"] for x in runs if x["row"] == r and "gbps" in x]
    med[r] = statistics.median(v) if v else None
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t") if "model name" in open("/proc/cpuinfo").read() else "?"
lines = [
    "# WireGuard portal throughput",
    "",
    f"Date {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores, kernel {platform.release()}.",
    f"Command: `sudo REPS={reps} DURATION={duration} bench/netns/portal.sh`; single TCP stream, medians of {reps} runs of {duration} s.",
    "Client: Debian's wireguard-go (userspace) with the config `weft wg add` printed; portal: boringtun's noise module in weft.",
    "",
    "| path | Gbit/s (median) | vs weft P->A | retransmits (median) |",
    "|---|---|---|---|",
]
base = med["weft P->A"]
for r in rows:
    m = med[r]
    retr = [x.get("retransmits", 0) for x in runs if x["row"] == r and "gbps" in x]
    ratio = f"{m / base:.2f}x" if m and base else "-"
    lines.append(f"| {r} | {m:.2f} | {ratio} | {statistics.median(retr) if retr else '-'} |" if m else f"| {r} | failed | - | - |")
drops = [l for l in open(wg_list) if l.startswith("drops")]
overflows = ", ".join(f"{l.split()[0].upper()} {l.split()[1] if len(l.split()) > 1 else '?'}" for l in open(rcvbuf) if l.strip())
lines += ["", f"UDP receive-buffer overflows over the whole run (nstat UdpRcvbufErrors): {overflows}."]
lines += ["", f"Portal node peak RSS under traffic: {int(rss) / 1024:.1f} MiB. Portal drops at the end: {drops[0].split(None, 1)[1].strip() if drops else 'none'}."]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
json.dump({"runs": runs, "medians_gbps": med, "portal_peak_rss_kib": int(rss)}, open(os.path.join(out, "results.json"), "w"), indent=1)
print("\n".join(lines))
EOF
