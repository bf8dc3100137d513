#!/usr/bin/env bash
# Throughput under packet loss: iperf3 (one TCP stream, B sends to A) between two network
# namespaces joined by one veth pair whose packets are dropped at random by nftables, at
# each loss rate: once over the veth itself (plain TCP, no tunnel: the baseline, taken in
# the same run) and once through Weft over each transport (udp, tcp, ws, wss, quic).
#
#   sudo bench/netns/loss.sh                 # full run: REPS=3, DURATION=10, loss 0 0.1 1 5 %
#   sudo bench/netns/loss.sh --quick         # smoke run: REPS=1, DURATION=3, loss 0 and 1 %
#
# Environment: DURATION (s per iperf3 run, default 10), REPS (default 3), LOSS ("0 0.1 1 5",
# percent, up to two decimals), TRANSPORTS ("udp tcp ws wss quic"), CIPHER (weft's cipher,
# default aes-128-gcm), WEFT (weft binary; default: cargo build --release -p weft, then
# target/release/weft), WEFT_FLAGS (extra `weft up` flags for both nodes), OUT (default
# bench/results/loss), MAX_RUNTIME (seconds; the script stops itself after that, default
# computed from the plan).
#
# Loops: repetitions outermost, then loss rates, then the plain baseline and the transports,
# so machine noise spreads evenly. Weft is started fresh for every run with both nodes
# listening on that one transport only, and the run counts only if both nodes' `weft status
# --json` shows the peer established and direct over it; the loss is switched on after the
# tunnel is up and off again after iperf3, so every run starts the same way.
#
# Loss: an nftables rule in each namespace drops packets arriving on the veth
# (`iifname "eth0" numgen random mod 10000 < N drop`), so both directions lose the same
# fraction and loopback is untouched. The veth's segmentation offloads (TSO, GSO, UDP GSO)
# and GRO are off: otherwise the filter sees 64 KiB super-packets and one drop removes up
# to 45 wire packets at once. Every rate, 0 % included, runs on that same underlay; its
# ingress counters give the loss actually applied, reported beside the table.
#
# Nothing is routed by the root namespace: the only link is the veth pair between the two
# namespaces and neither has a default route, so no packet can leave them.
#
# Outputs in $OUT: results.md (tables and machine info), results.json (every run plus
# medians), logs/ (weft logs and `weft status --json` of the last run of each variant).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CMDLINE="$0${*:+ $*}"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    echo
    echo "Options: --quick, -h/--help"
}

QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$QUICK" = 1 ]; then
    REPS=1; DURATION=3; LOSS=${LOSS:-"0 1"}
fi
DURATION=${DURATION:-10}
REPS=${REPS:-3}
LOSS=${LOSS:-"0 0.1 1 5"}
TRANSPORTS=${TRANSPORTS:-"udp tcp ws wss quic"}
CIPHER=${CIPHER:-aes-128-gcm}
WEFT_FLAGS=${WEFT_FLAGS:-}
OUT=${OUT:-$ROOT/bench/results/loss}
for v in DURATION REPS ${MAX_RUNTIME:+MAX_RUNTIME}; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
declare -A LOSS_N=()   # rate as written -> drops per 10000 packets
for l in $LOSS; do
    [[ "$l" =~ ^([0-9]{1,3})(\.([0-9]{1,2}))?$ ]] || { echo "error: LOSS must hold percentages like 0.1 or 5, got '$l'" >&2; exit 2; }
    n=$(( 10#${BASH_REMATCH[1]} * 100 + 10#$(printf '%-2s' "${BASH_REMATCH[3]}" | tr ' ' 0) ))
    [ "$n" -le 10000 ] || { echo "error: loss rate $l % is above 100 %" >&2; exit 2; }
    LOSS_N[$l]=$n
done
for tr in $TRANSPORTS; do
    case "$tr" in udp|tcp|ws|wss|quic) ;; *) echo "error: TRANSPORTS: unknown transport '$tr' (udp tcp ws wss quic)" >&2; exit 2 ;; esac
done
[ -n "${LOSS// /}" ] || { echo "error: LOSS is empty" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (namespaces and TUN devices need CAP_NET_ADMIN)" >&2; exit 2; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------------------------------
# State and cleanup. Only PIDs this script started are ever signalled.
NS_A="wl-$$-a"; NS_B="wl-$$-b"
RUN=$(mktemp -d "/tmp/weft-loss.XXXXXX")
NS_MADE=0
TUN_PIDS=()       # the two weft nodes of the current run
DAEMON_PIDS=()    # iperf3 server
CUR_PID=""        # foreground job run through `fg_run`
WATCHDOG_PID=""

. "$HERE/procs.sh"

IN_CLEANUP=0
cleanup() {
    local rc=$? p
    set +e
    IN_CLEANUP=1
    trap - EXIT INT TERM
    [ -n "$WATCHDOG_PID" ] && kill -TERM "$WATCHDOG_PID" 2>/dev/null
    [ -n "$CUR_PID" ] && kill_pid "$CUR_PID"
    for p in "${TUN_PIDS[@]}" "${DAEMON_PIDS[@]}"; do kill_pid "$p"; done
    if [ "$NS_MADE" = 1 ]; then
        ip netns del "$NS_A" 2>/dev/null
        ip netns del "$NS_B" 2>/dev/null
    fi
    rm -rf "$RUN"
    exit "$rc"
}
install_traps

n_rates=$(wc -w <<<"$LOSS"); n_tr=$(wc -w <<<"$TRANSPORTS")
MAX_RUNTIME=${MAX_RUNTIME:-$(( 1200 + REPS * n_rates * (n_tr + 1) * (DURATION + 45) ))}
start_watchdog
log "plan: loss '$LOSS' %; plain TCP + weft ($CIPHER) over '$TRANSPORTS'; REPS=$REPS DURATION=${DURATION}s; stops itself after ${MAX_RUNTIME}s"

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
for req in ip:iproute2 ping:iputils-ping iperf3:iperf3 python3:python3 nft:nftables ethtool:ethtool; do
    command -v "${req%%:*}" >/dev/null && continue
    apt_install "${req##*:}" || { echo "error: '${req%%:*}' is missing and 'apt-get install ${req##*:}' failed" >&2; exit 1; }
done
PY="$(command -v python3)"
REPORT="$HERE/loss_report.py"
PEER="$HERE/report.py"
for f in "$REPORT" "$PEER"; do [ -f "$f" ] || { echo "error: $f is missing" >&2; exit 1; }; done

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

# ---------------------------------------------------------------------------------------
# Topology: two namespaces, one veth pair, nothing else; an nftables table in each that
# counts what arrives on the veth and drops the configured fraction of it.
ip netns add "$NS_A"; NS_MADE=1
ip netns add "$NS_B"
ip link add eth0 netns "$NS_A" type veth peer name eth0 netns "$NS_B"
ip -n "$NS_A" addr add 198.51.100.1/24 dev eth0
ip -n "$NS_B" addr add 198.51.100.2/24 dev eth0
for ns in "$NS_A" "$NS_B"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    # One wire packet per skb at the filter (see the header). Features a kernel lacks are skipped.
    for feat in tso gso gro tx-udp-segmentation tx-gso-list; do
        ip netns exec "$ns" ethtool -K eth0 "$feat" off >/dev/null 2>&1 || true
    done
    ip netns exec "$ns" nft -f - <<'EOF'
table inet weftloss {
    chain in {
        type filter hook prerouting priority -300; policy accept;
        iifname "eth0" counter
        iifname "eth0" meta length > 1514 counter
        iifname "eth0" meta length < 201 counter
    }
}
EOF
done

set_loss() { # RATE: replace the drop rule (none for 0 %)
    local n=${LOSS_N[$1]} ns
    for ns in "$NS_A" "$NS_B"; do
        ip netns exec "$ns" nft flush chain inet weftloss in
        ip netns exec "$ns" nft add rule inet weftloss in iifname '"eth0"' counter
        ip netns exec "$ns" nft add rule inet weftloss in iifname '"eth0"' meta length '>' 1514 counter
        ip netns exec "$ns" nft add rule inet weftloss in iifname '"eth0"' meta length '<' 201 counter
        if [ "$n" -gt 0 ]; then
            ip netns exec "$ns" nft add rule inet weftloss in iifname '"eth0"' numgen random mod 10000 '<' "$n" counter drop
        fi
    done
}
loss_counters() { # prints "seen oversize dropped small rcvbuf_errors", summed over both namespaces
    # (small: packets of at most 200 bytes; rcvbuf_errors: the kernel's UdpRcvbufErrors, UDP
    # datagrams dropped because a socket's receive buffer was full)
    local ns seen=0 big=0 drop=0 small=0 rcvbuf=0 s b d m r
    for ns in "$NS_A" "$NS_B"; do
        read -r s b d m < <(ip netns exec "$ns" nft list chain inet weftloss in | awk '
            /counter packets/ { for (i = 1; i <= NF; i++) if ($i == "packets") v = $(i + 1)
                if ($0 ~ /drop/) d = v; else if ($0 ~ /length >/) b = v; else if ($0 ~ /length </) m = v; else s = v }
            END { print s + 0, b + 0, d + 0, m + 0 }')
        r=$(ip netns exec "$ns" nstat -az UdpRcvbufErrors 2>/dev/null | awk '$1 == "UdpRcvbufErrors" {print $2}')
        seen=$((seen + s)); big=$((big + b)); drop=$((drop + d)); small=$((small + m)); rcvbuf=$((rcvbuf + ${r:-0}))
    done
    echo "$seen $big $drop $small $rcvbuf"
}
set_loss 0
# Check that the filter sees wire packets: a short plain TCP run must leave no oversize one.
wait_for() { # DEADLINE_S CMD...: poll every 0.2 s until CMD succeeds (0), the deadline passes
    # (1) or one of the weft nodes exits (2).
    local end=$(( $(date +%s) + $1 )); shift
    while :; do
        "$@" >/dev/null 2>&1 && return 0
        alive_all || return 2
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}
alive_all() { local p; for p in "${TUN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done; }

iperf_listening() { ip netns exec "$NS_A" ss -Hltn 'sport = :5201' | grep -q .; }
start_iperf_server() {
    ip netns exec "$NS_A" iperf3 -s -p 5201 >"$RUN/iperf3-server.log" 2>&1 &
    IPERF_SRV=$!
    DAEMON_PIDS+=("$IPERF_SRV")
    wait_for 10 iperf_listening || { echo "error: iperf3 server did not start" >&2; cat "$RUN/iperf3-server.log" >&2; exit 1; }
}
restart_iperf_server() {
    local keep=() p
    kill_pid "$IPERF_SRV"
    for p in "${DAEMON_PIDS[@]}"; do [ "$p" = "$IPERF_SRV" ] || keep+=("$p"); done
    DAEMON_PIDS=("${keep[@]}")
    start_iperf_server
}
start_iperf_server
fg_run timeout 20 ip netns exec "$NS_B" iperf3 -c 198.51.100.1 -t 1 >/dev/null 2>&1 || true
read -r seen big _ _ _ < <(loss_counters)
if [ "$big" -gt 0 ] || [ "$seen" -eq 0 ]; then
    echo "error: the loss filter saw $big of $seen packets larger than 1514 bytes: offloads are still on, loss would come in bursts" >&2
    exit 1
fi
log "underlay check: $seen packets, none larger than 1514 bytes"
# Round-trip time of the underlay: loss costs TCP in proportion to it (Mathis: rate ~ MSS/(RTT*sqrt(p))).
UNDERLAY_RTT=$(ip netns exec "$NS_B" ping -c 5 -i 0.2 -q 198.51.100.1 2>/dev/null | awk -F/ '/^rtt|^round-trip/ {print $5 " ms"}')
log "underlay rtt (ping, mean of 5): ${UNDERLAY_RTT:-?}"

# ---------------------------------------------------------------------------------------
# Weft.
LOGS="$RUN/logs"; mkdir -p "$LOGS"
declare -A PID_LOG=()
spawn() { # LOG NS CMD...
    local logf=$1 ns=$2; shift 2
    : >"$logf"
    ip netns exec "$ns" "$@" >>"$logf" 2>&1 &
    TUN_PIDS+=($!)
    PID_LOG[$!]=$logf
}
stop_weft() { local p; for p in "${TUN_PIDS[@]}"; do kill_pid "$p"; done; TUN_PIDS=(); }
weft_listen() { case "$1" in udp|tcp) echo "$1://0.0.0.0:11010" ;; ws) echo "ws://0.0.0.0:11011" ;; *) echo "$1://0.0.0.0:11012" ;; esac; }
weft_peer_uri() { # TRANSPORT HOST
    case "$1" in udp|tcp) echo "$1://$2:11010" ;; ws) echo "ws://$2:11011/" ;; wss) echo "wss://$2:11012/" ;; quic) echo "quic://$2:11012" ;; esac
}
check_transport() { # TRANSPORT: both nodes see each other established and direct over it (else ERR)
    local side ctl peer got
    ERR=""
    for side in a b; do
        if [ "$side" = a ]; then ctl=$CTL_A; peer=10.200.0.2; else ctl=$CTL_B; peer=10.200.0.1; fi
        got=$("$WEFT_BIN" status --control "$ctl" --json 2>/dev/null | "$PY" "$PEER" peer --overlay "$peer" 2>&1) || got="no status ($got)"
        if [ "$got" != "established direct $1" ]; then
            ERR="node $side sees its peer as '$got', expected 'established direct $1'"
            return 1
        fi
    done
}
ping_a() { ip netns exec "$NS_B" ping -c 1 -W 1 -q 10.200.0.1; }
start_weft() { # TRANSPORT TAG: returns non-zero with ERR set if the tunnel is not up over TRANSPORT
    local tr=$1 d="$RUN/$2" listen rc=0
    mkdir -p "$d"
    listen=$(weft_listen "$tr")
    CTL_A="$d/a.sock"; CTL_B="$d/b.sock"
    export WEFT_NETWORK_SECRET="bench-secret-$$"   # from the environment: stays out of ps
    # shellcheck disable=SC2086  # WEFT_FLAGS is a list of flags
    spawn "$LOGS/weft-$tr-a.log" "$NS_A" "$WEFT_BIN" up --network-name bench -i 10.200.0.1/24 -l "$listen" \
        --state-dir "$d/a" --control "$CTL_A" --cipher "$CIPHER" $WEFT_FLAGS
    # shellcheck disable=SC2086
    spawn "$LOGS/weft-$tr-b.log" "$NS_B" "$WEFT_BIN" up --network-name bench -i 10.200.0.2/24 -l "$listen" \
        -p "$(weft_peer_uri "$tr" 198.51.100.1)" --state-dir "$d/b" --control "$CTL_B" --cipher "$CIPHER" $WEFT_FLAGS
    wait_for 20 check_transport "$tr" || rc=$?
    if [ "$rc" = 0 ]; then wait_for 10 ping_a || rc=$?; fi
    case "$rc" in
        0) return 0 ;;
        2) ERR="a weft node exited: $(for p in "${TUN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || tail -n1 "${PID_LOG[$p]}"; done | head -n1)" ;;
        *) check_transport "$tr" || true; ERR="not up over $tr within 30 s${ERR:+: $ERR}" ;;
    esac
    return 1
}

# ---------------------------------------------------------------------------------------
# One run: loss on, iperf3 for DURATION seconds, loss off.
RUNS="$RUN/runs.jsonl"; : >"$RUNS"
one_run() { # REP RATE VARIANT(plain|udp|tcp|ws|wss|quic)
    local rep=$1 rate=$2 var=$3 target=10.200.0.1 json rc=0 note="" c0 c1 status=""
    json="$RUN/iperf-r$rep-$rate-$var.json"; : >"$json"
    ERR=""
    if [ "$var" = plain ]; then
        target=198.51.100.1
    elif ! start_weft "$var" "r$rep-$rate-$var"; then
        log "ERROR: weft over $var (loss $rate %, rep $rep) did not come up: $ERR"
        for f in "$LOGS"/weft-"$var"-?.log; do cp "$f" "$LOGS/failed-r$rep-$rate-${f##*/}"; done
        "$PY" "$REPORT" record --rep "$rep" --loss "$rate" --variant "$var" --failed "$ERR" >>"$RUNS"
        tail -n1 "$RUNS" | "$PY" "$REPORT" line >&2 || true
        stop_weft
        return
    fi
    set_loss "$rate"
    c0=$(loss_counters)
    fg_run timeout $((DURATION + 40)) ip netns exec "$NS_B" iperf3 -c "$target" -p 5201 -J -t "$DURATION" \
        --connect-timeout 10000 >"$json" 2>"$json.err" || rc=$?
    c1=$(loss_counters)
    set_loss 0
    if [ "$var" != plain ]; then
        alive_all || note="a weft node exited during the run"
        if [ -z "$note" ] && ! check_transport "$var"; then note="transport changed during the run: $ERR"; fi
        [ -z "$note" ] || log "ERROR: weft over $var (loss $rate %, rep $rep): $note"
        status="$RUN/status-r$rep-$rate-$var"
        "$WEFT_BIN" status --control "$CTL_A" --json >"$status-a.json" 2>/dev/null || true
        "$WEFT_BIN" status --control "$CTL_B" --json >"$status-b.json" 2>/dev/null || true
        cp "$status-a.json" "$LOGS/weft-$var-loss$rate-a.status.json"
        cp "$status-b.json" "$LOGS/weft-$var-loss$rate-b.status.json"
        for f in "$LOGS"/weft-"$var"-?.log; do cp "$f" "${f%.log}-loss$rate.log"; done
        stop_weft
    fi
    "$PY" "$REPORT" record --rep "$rep" --loss "$rate" --variant "$var" --iperf "$json" --rc "$rc" \
        --counters "$c0" "$c1" ${status:+--status "$status-a.json" "$status-b.json"} --note "$note" >>"$RUNS"
    tail -n1 "$RUNS" | "$PY" "$REPORT" line >&2 || true
    # A failed or timed-out client can leave the server stuck in a test; start afresh.
    [ "$rc" = 0 ] || restart_iperf_server
}

for rep in $(seq "$REPS"); do
    log "repetition $rep/$REPS"
    for rate in $LOSS; do
        for var in plain $TRANSPORTS; do one_run "$rep" "$rate" "$var"; done
    done
done

# ---------------------------------------------------------------------------------------
# Report.
mkdir -p "$OUT"
rm -rf "$OUT/logs"; cp -r "$LOGS" "$OUT/logs"
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cmdline=$CMDLINE"
    echo "nproc=$(nproc)"
    echo "kernel=$(uname -srm)"
    echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
    echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "reps=$REPS"; echo "duration=$DURATION"; echo "loss=$LOSS"; echo "transports=$TRANSPORTS"
    echo "cipher=$CIPHER"; echo "weft_flags=$WEFT_FLAGS"; echo "quick=$QUICK"
    echo "weft=$WEFT_VERSION"
    echo "iperf3=$(iperf3 --version 2>/dev/null | head -n1)"
    echo "underlay_rtt=${UNDERLAY_RTT:-?}"
} >"$RUN/meta.txt"
"$PY" "$REPORT" report --runs "$RUNS" --meta "$RUN/meta.txt" --out "$OUT"
log "wrote $OUT/results.md and $OUT/results.json"
