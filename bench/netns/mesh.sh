#!/usr/bin/env bash
# A mesh of real Weft nodes on one machine (issue 12, "Real nodes"; not run in CI): NODES
# `weft up` processes, each in its own network namespace, then all-pairs reachability, the
# first-packet and steady ping RTT (direct and relayed pairs apart), and per node at rest:
# RSS, CPU, threads, fds and the underlay bytes it sends and receives.
#
#   sudo bench/netns/mesh.sh                     # 50 nodes, 60 s at rest
#   sudo NODES=10 REST_S=20 bench/netns/mesh.sh  # a quick one
#
# Environment: NODES (default 50), REST_S (seconds of the at-rest window, default 60), SEED
# (topology seed, default 1), BLOCK_PCT (percent of all pairs blocked on the underlay,
# default 30), WEFT (weft binary; default: cargo build --release -p weft, then
# target/release/weft), WEFT_FLAGS (extra `weft up` flags for every node), PINGS (echo
# requests per ordered pair, default 5), CONVERGE_S (how long to wait for full routes,
# default 300), OUT (default bench/results/mesh), KEEP_LOGS=1 (copy the nodes' logs to
# OUT/logs), MAX_RUNTIME (seconds; default 900: the script then cleans up and exits 143).
#
# Topology. One "switch" namespace holds a Linux bridge (br0, no address, STP off); every
# node k (1..NODES) has its own namespace with one veth, eth0 (underlay 10.200.0.0/16:
# node k is 10.200.((k-1)/250).((k-1)%250+1)), whose other end v<k> is a port of br0. No
# namespace has a default route, IPv4 forwarding is off and IPv6 is disabled everywhere, the
# root namespace has no interface or route into any of them: no packet can leave the test.
# Every node holds a permanent ARP entry for every other (see "Static neighbours" below).
# Every node listens on udp://0.0.0.0:11010 only, has overlay address 10.201.x.y/16 (same
# x.y as its underlay address) on weft0, and dials one earlier node picked at random (seeded:
# mesh_report.py plan; node 1 dials nobody). BLOCK_PCT % of all pairs, drawn among the pairs
# that are not such a dial, are blocked on the underlay by an nftables rule in the switch
# (bridge family, forward hook: `ip saddr . ip daddr @blocked drop`, both directions), so
# those pairs can only reach each other relayed, hole punching included; the rule's
# counter shows how much it dropped. The other pairs are free to go direct by hole punching.
#
# Steps: start every node (node 1 first), wait until every node has a route to every other
# (`weft routes --json`) and then a session with every other, and record both times from
# the first start. Then each node in turn (n1, n2, ...) pings every other node's overlay
# address (fping -C PINGS, 200 ms apart per target): since the nodes ping one after another,
# n_i -> n_j with i < j is the first packet that pair ever exchanges ("cold"), and with i > j
# the other way was pinged before ("warm"). Then REST_S seconds at rest: /proc/PID/stat
# (utime+stime) and the switch's veth counters before and after, /proc/PID/status (VmRSS,
# VmHWM, Threads) and /proc/PID/fd after. Finally every node's `weft peers --json`: the path
# to each peer, checked against the block (a blocked pair shown direct would be a leak).
#
# Outputs in $OUT: results.json (summary and per-node rows), results.md (the tables, also
# printed). Exit status: 0 when every pair answered; 3 when some did not or the routes never
# converged; 1 on an error; 143 when MAX_RUNTIME stopped it.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CMDLINE="$0${*:+ $*}"

case "${1:-}" in
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    "") ;;
    *) echo "error: no arguments expected (see --help); settings come from the environment" >&2; exit 2 ;;
esac

NODES=${NODES:-50}
REST_S=${REST_S:-60}
SEED=${SEED:-1}
BLOCK_PCT=${BLOCK_PCT:-30}
PINGS=${PINGS:-5}
CONVERGE_S=${CONVERGE_S:-300}
MAX_RUNTIME=${MAX_RUNTIME:-900}
WEFT_FLAGS=${WEFT_FLAGS:-}
KEEP_LOGS=${KEEP_LOGS:-0}
OUT=${OUT:-$ROOT/bench/results/mesh}
for v in NODES REST_S PINGS CONVERGE_S MAX_RUNTIME; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "error: SEED must be a non-negative integer, got '$SEED'" >&2; exit 2; }
[[ "$BLOCK_PCT" =~ ^[0-9]{1,2}$ ]] || { echo "error: BLOCK_PCT must be 0..99, got '$BLOCK_PCT'" >&2; exit 2; }
[ "$NODES" -ge 2 ] && [ "$NODES" -le 1000 ] || { echo "error: NODES must be 2..1000" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (namespaces and TUN devices need CAP_NET_ADMIN)" >&2; exit 2; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------------------------------
# State and cleanup. Only PIDs this script started are ever signalled; only namespaces it
# created (named wm-$$-...) are deleted.
PFX="wm-$$"
NS_SW="$PFX-sw"
RUN=$(mktemp -d "/tmp/weft-mesh.XXXXXX")
NS_LIST=()        # namespaces created so far
NODE_PIDS=()      # index k -> PID of node k's weft (index 0 unused)
CUR_PID=""        # foreground job run through `fg_run`
WATCHDOG_PID=""

. "$HERE/procs.sh"

IN_CLEANUP=0
cleanup() {
    local rc=$? p i ns
    set +e
    IN_CLEANUP=1
    trap - EXIT INT TERM
    [ -n "$WATCHDOG_PID" ] && kill -TERM "$WATCHDOG_PID" 2>/dev/null
    [ -n "$CUR_PID" ] && kill_pid "$CUR_PID"
    # TERM every node at once, give them 5 s together, then KILL what is left.
    for p in "${NODE_PIDS[@]}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for p in "${NODE_PIDS[@]}"; do [ -n "$p" ] && proc_alive "$p" && { alive=1; break; }; done
        [ "$alive" = 1 ] || break
        sleep 0.1
    done
    for p in "${NODE_PIDS[@]}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
    for ns in "${NS_LIST[@]}"; do ip netns del "$ns" 2>/dev/null; done
    rm -rf "$RUN"
    exit "$rc"
}
install_traps
start_watchdog
log "plan: $NODES nodes, ${BLOCK_PCT} % of pairs blocked (seed $SEED), ${REST_S} s at rest; stops itself after ${MAX_RUNTIME}s"

# ---------------------------------------------------------------------------------------
# Tools.
APT_UPDATED=0
apt_install() { # PKG...
    command -v apt-get >/dev/null || return 1
    log "installing $* (apt-get install -y --no-install-recommends $*)"
    if ! DEBIAN_FRONTEND=noninteractive fg_run timeout 900 apt-get install -y -qq --no-install-recommends "$@" >>"$RUN/install.log" 2>&1; then
        [ "$APT_UPDATED" = 0 ] || return 1
        APT_UPDATED=1
        fg_run timeout 600 apt-get update -qq >>"$RUN/install.log" 2>&1 || return 1
        DEBIAN_FRONTEND=noninteractive fg_run timeout 900 apt-get install -y -qq --no-install-recommends "$@" >>"$RUN/install.log" 2>&1 || return 1
    fi
}
for req in ip:iproute2 fping:fping jq:jq nft:nftables python3:python3; do
    command -v "${req%%:*}" >/dev/null && continue
    apt_install "${req##*:}" || { echo "error: '${req%%:*}' is missing and 'apt-get install ${req##*:}' failed" >&2; exit 1; }
done
PY="$(command -v python3)"
REPORT="$HERE/mesh_report.py"
[ -f "$REPORT" ] || { echo "error: $REPORT is missing" >&2; exit 1; }

WEFT_REV=""
if [ -n "${WEFT:-}" ]; then
    [ -x "$WEFT" ] || { echo "error: WEFT=$WEFT is not an executable" >&2; exit 2; }
else
    command -v cargo >/dev/null || { echo "error: cargo not found and WEFT not set" >&2; exit 1; }
    log "building weft (cargo build --release -p weft in $ROOT)"
    if ! fg_run timeout 2400 cargo build --release -p weft --manifest-path "$ROOT/Cargo.toml" >"$RUN/weft-build.log" 2>&1; then
        tail -n 20 "$RUN/weft-build.log" >&2; echo "error: cargo build --release -p weft failed" >&2; exit 1
    fi
    WEFT="$ROOT/target/release/weft"
    WEFT_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || true)
fi
# A private copy, so a concurrent rebuild cannot swap the binary mid-run.
cp "$WEFT" "$RUN/weft"; WEFT_BIN="$RUN/weft"
WEFT_VERSION="$("$WEFT_BIN" --version 2>/dev/null | head -n1)${WEFT_REV:+ (built from git $WEFT_REV)}"

DATA="$RUN/data"; LOGS="$RUN/logs"
mkdir -p "$DATA/fping" "$DATA/peers" "$LOGS"
CLK_TCK=$(getconf CLK_TCK)
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
MACHINE="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, Linux $(uname -r)"

# ---------------------------------------------------------------------------------------
# Plan: dial parent of each node and the blocked pairs (seeded).
"$PY" "$REPORT" plan --nodes "$NODES" --seed "$SEED" --block-pct "$BLOCK_PCT" >"$DATA/plan.txt"
declare -a PARENT=()
BLOCKED=()
while read -r a b c; do
    if [ "$a" = block ]; then BLOCKED+=("$b $c"); else PARENT[$a]=$b; fi
done <"$DATA/plan.txt"

under() { echo "10.200.$((($1 - 1) / 250)).$((($1 - 1) % 250 + 1))"; }
over() { echo "10.201.$((($1 - 1) / 250)).$((($1 - 1) % 250 + 1))"; }
ns_of() { echo "$PFX-n$1"; }
mac() { printf '02:57:00:00:%02x:%02x' $(($1 / 256)) $(($1 % 256)); }
: >"$DATA/nodes.txt"
for ((k = 1; k <= NODES; k++)); do echo "$k $(under "$k") $(over "$k")" >>"$DATA/nodes.txt"; done

# ---------------------------------------------------------------------------------------
# Topology (see the header).
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
quiet_ns() { # NS: no forwarding, no IPv6 (no router solicitations or MLD on the underlay)
    nsx "$1" sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
}
log "building the topology: switch $NS_SW and $NODES node namespaces"
ip netns add "$NS_SW"; NS_LIST+=("$NS_SW")
quiet_ns "$NS_SW"
ip -n "$NS_SW" link set lo up
ip -n "$NS_SW" link add br0 type bridge stp_state 0 forward_delay 0
ip -n "$NS_SW" link set br0 up
for ((k = 1; k <= NODES; k++)); do
    ns=$(ns_of "$k")
    ip netns add "$ns"; NS_LIST+=("$ns")
    quiet_ns "$ns"
    ip link add eth0 netns "$ns" address "$(mac "$k")" type veth peer name "v$k" netns "$NS_SW"
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(under "$k")/16" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$NS_SW" link set "v$k" master br0
    ip -n "$NS_SW" link set "v$k" up
done
# Static neighbours: the kernel's ARP table is shared by all namespaces, and its limit
# (net.ipv4.neigh.default.gc_thresh3, 1024 by default, settable only in the root namespace)
# is below NODES * (NODES - 1) entries at 50 nodes: past it, sends fail with ENOBUFS
# ("neighbor table overflow"). Permanent entries do not count against it (Linux >= 5.0), so
# every node gets one for every other and never ARPs; the host's settings stay untouched.
for ((k = 1; k <= NODES; k++)); do
    for ((j = 1; j <= NODES; j++)); do
        [ "$j" = "$k" ] || echo "neigh replace $(under "$j") lladdr $(mac "$j") dev eth0 nud permanent"
    done | ip -n "$(ns_of "$k")" -batch -
done
{
    echo "table bridge weftmesh {"
    echo "    set blocked { type ipv4_addr . ipv4_addr;"
    if [ "${#BLOCKED[@]}" -gt 0 ]; then
        echo -n "        elements = { "
        first=1
        for pair in "${BLOCKED[@]}"; do
            i=${pair% *}; j=${pair#* }
            [ "$first" = 1 ] || echo -n ", "
            first=0
            echo -n "$(under "$i") . $(under "$j"), $(under "$j") . $(under "$i")"
        done
        echo " }"
    fi
    echo "    }"
    echo "    chain forward {"
    echo "        type filter hook forward priority 0; policy accept;"
    echo "        ip saddr . ip daddr @blocked counter drop"
    echo "    }"
    echo "}"
} >"$RUN/block.nft"
nsx "$NS_SW" nft -f "$RUN/block.nft"
log "underlay: ${#BLOCKED[@]} pairs blocked, $((NODES - 1)) dial links"
# The block must hold before any node starts: a ping across a blocked pair fails, an open one works.
if [ "${#BLOCKED[@]}" -gt 0 ]; then
    pair=${BLOCKED[0]}; i=${pair% *}; j=${pair#* }
    if nsx "$(ns_of "$i")" ping -c 1 -W 1 -q "$(under "$j")" >/dev/null 2>&1; then
        echo "error: the underlay block does not hold (n$i reaches n$j)" >&2; exit 1
    fi
    nsx "$(ns_of 2)" ping -c 1 -W 2 -q "$(under "${PARENT[2]}")" >/dev/null 2>&1 \
        || { echo "error: n2 cannot reach its dial target n${PARENT[2]} on the underlay" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------------------
# Nodes.
export WEFT_NETWORK_SECRET
WEFT_NETWORK_SECRET=$("$WEFT_BIN" secret generate 2>/dev/null | tail -n1) || true
[ -n "$WEFT_NETWORK_SECRET" ] || WEFT_NETWORK_SECRET="mesh-bench-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
sock() { echo "$RUN/n$1/ctl.sock"; }
start_node() { # K
    local k=$1 peer=()
    mkdir -p "$RUN/n$k"
    [ "${PARENT[$k]}" -gt 0 ] && peer=(-p "udp://$(under "${PARENT[$k]}"):11010")
    # `ip netns exec` execs weft, so $! is weft's own PID.
    # shellcheck disable=SC2086  # WEFT_FLAGS is a list of flags
    ip netns exec "$(ns_of "$k")" "$WEFT_BIN" up --network-name mesh -i "$(over "$k")/16" \
        -l udp://0.0.0.0:11010 "${peer[@]}" --hostname "n$k" --state-dir "$RUN/n$k/state" \
        --control "$(sock "$k")" $WEFT_FLAGS >"$LOGS/n$k.log" 2>&1 </dev/null &
    NODE_PIDS[$k]=$!
}
dead_nodes() { # prints "nK" for every node whose process is gone
    local k
    for ((k = 1; k <= NODES; k++)); do proc_alive "${NODE_PIDS[$k]}" || echo -n "n$k "; done
}
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

log "starting $NODES nodes ($WEFT_VERSION)"
T0=$(now)
start_node 1
for ((i = 0; i < 100; i++)); do [ -S "$(sock 1)" ] && break; proc_alive "${NODE_PIDS[1]}" || break; sleep 0.1; done
[ -S "$(sock 1)" ] || { echo "error: node 1 did not open its control socket:" >&2; tail -n 5 "$LOGS/n1.log" >&2; exit 1; }
for ((k = 2; k <= NODES; k++)); do start_node "$k"; sleep 0.05; done
T_START=$(since "$T0")
log "all $NODES processes started in ${T_START}s"

# Convergence: routes (and sessions) to every other node, on every node, in one pass.
node_view() { # K: prints "routes sessions" as node K reports them
    "$WEFT_BIN" routes --control "$(sock "$1")" --json 2>/dev/null \
        | jq -r '(if type == "array" then . else .routes end) as $r | "\($r | length) \([$r[] | select(.session)] | length)"' 2>/dev/null \
        || echo "0 0"
}
T_ROUTES=""; T_SESSIONS=""
deadline=$(( $(date +%s) + CONVERGE_S ))
while :; do
    all_routes=1; all_sessions=1; min_r=$NODES; min_s=$NODES
    for ((k = 1; k <= NODES; k++)); do
        read -r r s < <(node_view "$k") || true
        r=${r:-0}; s=${s:-0}
        [ "$r" -lt "$min_r" ] && min_r=$r
        [ "$s" -lt "$min_s" ] && min_s=$s
        [ "$r" -ge $((NODES - 1)) ] || all_routes=0
        [ "$s" -ge $((NODES - 1)) ] || all_sessions=0
        # Until the routes are complete, the first incomplete node ends the pass (faster
        # detection); the last pass before the deadline asks every node, for the warning.
        [ "$all_routes" = 1 ] || [ -n "$T_ROUTES" ] || [ "$(date +%s)" -ge "$deadline" ] || break
    done
    [ -z "$T_ROUTES" ] && [ "$all_routes" = 1 ] && { T_ROUTES=$(since "$T0"); log "every node has a route to every other after ${T_ROUTES}s"; }
    # Sessions are made on demand (by the pings below): routes are what convergence means.
    [ -n "$T_ROUTES" ] && [ "${WAIT_SESSIONS:-0}" != 1 ] && break
    [ -n "$T_ROUTES" ] && [ "$all_sessions" = 1 ] && { T_SESSIONS=$(since "$T0"); log "every node has a session with every other after ${T_SESSIONS}s"; break; }
    dead=$(dead_nodes)
    [ -z "$dead" ] || { echo "error: nodes exited: $dead" >&2; for d in $dead; do tail -n 3 "$LOGS/$d.log" >&2; done; exit 1; }
    if [ "$(date +%s)" -ge "$deadline" ]; then
        log "WARNING: not converged after ${CONVERGE_S}s (fewest routes on a node: $min_r, sessions: $min_s of $((NODES - 1))); measuring anyway"
        break
    fi
    sleep 1
done
printf 'start_s=%s\nroutes_s=%s\nsessions_s=%s\n' "$T_START" "${T_ROUTES:-none}" "${T_SESSIONS:-none}" >"$DATA/converge.txt"

# ---------------------------------------------------------------------------------------
# All pairs: each node in turn pings every other (see the header for cold and warm).
log "pinging all pairs ($PINGS echo requests per ordered pair, node after node)"
T_PING=$(now)
for ((i = 1; i <= NODES; i++)); do
    targets=()
    for ((j = 1; j <= NODES; j++)); do [ "$j" = "$i" ] || targets+=("$(over "$j")"); done
    # -C: per-target RTT list on stderr; -p 200: 200 ms between pings to one target; -i 1:
    # 1 ms between any two; -t 2000: a reply counts up to 2 s (room for a handshake first).
    fg_run timeout 120 ip netns exec "$(ns_of "$i")" fping -q -C "$PINGS" -p 200 -i 1 -t 2000 -B 1 "${targets[@]}" \
        >/dev/null 2>"$DATA/fping/n$i.txt" || true
done
log "pings done in $(since "$T_PING")s"

# ---------------------------------------------------------------------------------------
# At rest.
snap_procs() { # FILE: "k pid ticks rss_kib hwm_kib threads fds" per live node
    local k p st rss hwm thr fds
    : >"$1"
    for ((k = 1; k <= NODES; k++)); do
        p=${NODE_PIDS[$k]}
        proc_alive "$p" || continue
        read -r st <"/proc/$p/stat" || continue
        st=${st##*) }
        rss=$(awk '/^VmRSS:/ {r = $2} /^VmHWM:/ {h = $2} /^Threads:/ {t = $2} END {print r + 0, h + 0, t + 0}' "/proc/$p/status")
        fds=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        echo "$k $p $(awk '{print $12 + $13}' <<<"$st") $rss $fds" >>"$1"
    done
}
block_counter() { nsx "$NS_SW" nft -j list chain bridge weftmesh forward | jq -r '[.nftables[] | .rule? // empty | .expr[] | .counter? // empty] | first | "dropped_packets=\(.packets)\ndropped_bytes=\(.bytes)"'; }
log "at rest for ${REST_S}s"
nsx "$NS_SW" ip -s -j link show >"$DATA/veth_start.json"
snap_procs "$DATA/rest_start.txt"
T_REST=$(now)
fg_run sleep "$REST_S"
nsx "$NS_SW" ip -s -j link show >"$DATA/veth_end.json"
snap_procs "$DATA/rest_end.txt"
REST_WINDOW=$(awk -v a="$T_REST" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
block_counter >"$DATA/block.txt" || true
for ((k = 1; k <= NODES; k++)); do
    "$WEFT_BIN" peers --control "$(sock "$k")" --json >"$DATA/peers/n$k.json" 2>/dev/null || true
done
dead=$(dead_nodes)
[ -z "$dead" ] || log "WARNING: nodes exited during the run: $dead"
errors=$(cat "$LOGS"/n*.log | grep -c -E '\b(ERROR|WARN)\b' || true)

{
    echo "nodes=$NODES"; echo "seed=$SEED"; echo "block_pct=$BLOCK_PCT"; echo "rest_s=$REST_S"
    echo "rest_window_s=$REST_WINDOW"; echo "clk_tck=$CLK_TCK"; echo "weft=$WEFT_VERSION"
    echo "weft_flags=$WEFT_FLAGS"; echo "machine=$MACHINE"; echo "started=$STARTED"
    echo "cmdline=NODES=$NODES REST_S=$REST_S SEED=$SEED BLOCK_PCT=$BLOCK_PCT PINGS=$PINGS ${CMDLINE#"$ROOT"/}"
    echo "log_warnings=$errors"; echo "dead_nodes=$dead"
} >"$DATA/meta.txt"

mkdir -p "$OUT"
rc=0
"$PY" "$REPORT" report "$DATA" "$OUT" || rc=$?
if [ "$KEEP_LOGS" = 1 ]; then
    rm -rf "$OUT/logs"; mkdir -p "$OUT/logs"; cp "$LOGS"/n*.log "$OUT/logs/"
fi
log "weft log lines at WARN or ERROR, all nodes: $errors${dead:+; exited: $dead}"
log "done in $(since "$T0")s from the first start; results in $OUT"
[ -z "$dead" ] || rc=3
exit "$rc"
