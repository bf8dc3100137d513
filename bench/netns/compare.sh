#!/usr/bin/env bash
# Netns throughput comparison: iperf3 between two network namespaces joined by one veth
# pair, first directly (the baseline), then through Weft (each cipher over UDP, and the first
# cipher over each other transport) and through other userspace mesh/VPN tools (wireguard-go,
# boringtun, nebula, EasyTier when installed).
#
#   sudo bench/netns/compare.sh                  # full run: REPS=3, DURATION=10, -P 1 and -P 4
#   sudo bench/netns/compare.sh --quick          # smoke run: REPS=1, DURATION=3, -P 1 only
#   sudo bench/netns/compare.sh --only weft,nebula
#
# Environment: DURATION (s per iperf3 run, default 10), REPS (default 3), STREAMS ("1 4"),
# WEFT (weft binary; default: cargo build --release -p weft, then target/release/weft),
# WEFT_A (another weft binary for node A only, the iperf3 server: a mixed-version pair,
# e.g. WEFT_A=$(scripts/build-previous.sh)),
# WEFT_FLAGS (extra `weft up` flags for both nodes), WEFT_CIPHERS (default: all three),
# WEFT_TRANSPORTS (default "udp tcp ws wss quic ipv6": every cipher runs over udp, the first
# cipher of WEFT_CIPHERS over each other transport; both nodes listen on that transport only and
# the row fails unless `weft status --json` shows it as the peer's transport; "ipv6" is UDP
# with iperf3 over the IPv6 overlay, fd00:200::1 and ::2, instead of the IPv4 one),
# MTU (inner MTU where the tool lets us set it, default 1420), OUT (default bench/results),
# MAX_RUNTIME (seconds; the script stops itself after that, default computed from the plan).
#
# Loops: repetitions outermost, tools inside, iperf3 configurations innermost, so machine
# noise spreads evenly over the tools. Each tool is started fresh for each repetition, in
# the same two namespaces, and stopped before the next one starts. Nothing is routed by the
# root namespace: the only link is the veth pair between the two namespaces, and neither
# namespace has a default route, so no packet can leave them.
#
# Outputs in $OUT: results.md (table, machine info, skipped tools), results.json (every raw
# run plus medians), chart.svg (single-stream medians), logs/ (tool logs of the last run).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CMDLINE="$0${*:+ $*}"

usage() {
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "Options: --quick, --only LIST (comma-separated; tools: direct weft wireguard-go boringtun nebula easytier;"
    echo "         the direct and loopback baselines always run), -h/--help"
}

ALL_TOOLS=(weft wireguard-go boringtun nebula easytier)
ONLY=""
QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --only) [ $# -ge 2 ] || { echo "error: --only needs a list" >&2; exit 2; }; ONLY="${ONLY:+$ONLY,}$2"; shift ;;
        --only=*) ONLY="${ONLY:+$ONLY,}${1#--only=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$QUICK" = 1 ]; then
    REPS=1; DURATION=3; STREAMS="1"
fi
DURATION=${DURATION:-10}
REPS=${REPS:-3}
STREAMS=${STREAMS:-"1 4"}
MTU=${MTU:-1420}
LATENCY=${LATENCY:-0}
IPERF_FLAGS=${IPERF_FLAGS:-}
PINGS=${PINGS:-500}
WEFT_CIPHERS=${WEFT_CIPHERS:-"aes-128-gcm chacha20-poly1305 none"}
WEFT_FLAGS=${WEFT_FLAGS:-}
WEFT_TRANSPORTS=${WEFT_TRANSPORTS:-"udp tcp ws wss quic ipv6"}
OUT=${OUT:-$ROOT/bench/results}
for v in DURATION REPS MTU PINGS ${MAX_RUNTIME:+MAX_RUNTIME}; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
# Latency mode pings from the bulk run's second second to two seconds before its end.
if [ "$LATENCY" = 1 ] && [ "$DURATION" -lt 4 ]; then
    echo "error: LATENCY=1 needs DURATION of at least 4 (s), got '$DURATION'" >&2; exit 2
fi
for s in $STREAMS; do
    [[ "$s" =~ ^[1-9][0-9]*$ ]] || { echo "error: STREAMS must hold positive integers, got '$s'" >&2; exit 2; }
done
for tr in $WEFT_TRANSPORTS; do
    case "$tr" in udp|tcp|ws|wss|quic|ipv6) ;; *) echo "error: WEFT_TRANSPORTS: unknown transport '$tr' (udp tcp ws wss quic ipv6)" >&2; exit 2 ;; esac
done
[ -n "${WEFT_CIPHERS// /}" ] || { echo "error: WEFT_CIPHERS is empty" >&2; exit 2; }
WEFT_CIPHER1=${WEFT_CIPHERS%% *}
# Weft variants, "CIPHER TRANSPORT" each: every cipher over udp, the first cipher over the rest.
WEFT_VARIANTS=()
for tr in $WEFT_TRANSPORTS; do
    if [ "$tr" = udp ]; then
        for c in $WEFT_CIPHERS; do WEFT_VARIANTS+=("$c udp"); done
    else
        WEFT_VARIANTS+=("$WEFT_CIPHER1 $tr")
    fi
done

TOOLS=()
if [ -z "$ONLY" ]; then
    TOOLS=("${ALL_TOOLS[@]}")
else
    IFS=', ' read -r -a req <<<"$ONLY"
    for t in "${req[@]}"; do
        [ -n "$t" ] || continue
        case "$t" in
            direct) ;;
            weft|wireguard-go|boringtun|nebula|easytier) ;;
            boringtun-cli) t=boringtun ;;
            *) echo "error: unknown tool '$t' in --only (direct weft wireguard-go boringtun nebula easytier)" >&2; exit 2 ;;
        esac
        picked=" ${picked:-} $t "
    done
    for t in "${ALL_TOOLS[@]}"; do [[ "${picked:-}" == *" $t "* ]] && TOOLS+=("$t"); done
fi

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (namespaces and TUN devices need CAP_NET_ADMIN)" >&2; exit 2; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------------------------------
# State and cleanup. Only PIDs this script started are ever signalled.
TAG=$(( $$ % 100000 ))
NS_A="wb-$$-a"; NS_B="wb-$$-b"
RUN=$(mktemp -d "/tmp/weft-bench.XXXXXX")
NS_MADE=0
TUN_PIDS=()       # tunnel processes of the tool under test (both sides)
DAEMON_PIDS=()    # long-lived helpers (iperf3 server)
CUR_PID=""        # foreground job run through `fg_run`
WATCHDOG_PID=""
UAPI_SOCKS=()     # wireguard UAPI sockets to remove if a tool died uncleanly

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
    for p in "${UAPI_SOCKS[@]}"; do rm -f "$p"; done
    rm -rf "$RUN"
    exit "$rc"
}
install_traps

# Bounded runtime: a watchdog TERMs this script after MAX_RUNTIME seconds.
n_variants=1
for t in "${TOOLS[@]}"; do
    if [ "$t" = weft ]; then n_variants=$((n_variants + ${#WEFT_VARIANTS[@]})); else n_variants=$((n_variants + 1)); fi
done
n_configs=$(( $(wc -w <<<"$STREAMS") * 2 ))
MAX_RUNTIME=${MAX_RUNTIME:-$(( 2400 + REPS * n_variants * (40 + n_configs * (DURATION + 15)) ))}
start_watchdog
plan_weft=""
if [[ " ${TOOLS[*]} " == *" weft "* ]]; then
    for v in "${WEFT_VARIANTS[@]}"; do plan_weft="${plan_weft:+$plan_weft, }${v% *} over ${v#* }"; done
    plan_weft=" (weft: $plan_weft)"
fi
log "plan: ${TOOLS[*]:-(direct only)}$plan_weft; REPS=$REPS DURATION=${DURATION}s STREAMS='$STREAMS'; stops itself after ${MAX_RUNTIME}s"

# ---------------------------------------------------------------------------------------
# Installation helpers: a failed install skips the tool, never the run.
APT_UPDATED=0
apt_install() { # PKG...
    local pkg need=0
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need=1; done
    [ "$need" = 1 ] || return 0
    command -v apt-get >/dev/null || return 1
    log "installing $* (apt-get install -y --no-install-recommends $*)"
    if ! DEBIAN_FRONTEND=noninteractive fg_run timeout 900 apt-get install -y -qq --no-install-recommends "$@" >>"$RUN/install.log" 2>&1; then
        [ "$APT_UPDATED" = 0 ] || return 1
        APT_UPDATED=1
        fg_run timeout 600 apt-get update -qq >>"$RUN/install.log" 2>&1 || return 1
        DEBIAN_FRONTEND=noninteractive fg_run timeout 900 apt-get install -y -qq --no-install-recommends "$@" >>"$RUN/install.log" 2>&1 || return 1
    fi
}

# Required tools.
for req in ip:iproute2 ping:iputils-ping iperf3:iperf3 python3:python3; do
    command -v "${req%%:*}" >/dev/null && continue
    apt_install "${req##*:}" || { echo "error: '${req%%:*}' is missing and 'apt-get install ${req##*:}' failed" >&2; exit 1; }
done
PY="$(command -v python3)"
REPORT="$HERE/report.py"
LATENCY_PY="$HERE/latency.py"
[ -f "$REPORT" ] || { echo "error: $REPORT is missing" >&2; exit 1; }
CLK_TCK=$(getconf CLK_TCK)

declare -A SKIP=()      # tool -> reason
declare -A VERSION=()   # tool -> version string

cargo_bin() { # NAME: path of an installed cargo binary or empty
    if command -v "$1" >/dev/null; then command -v "$1"; return; fi
    local d
    for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin; do
        [ -x "$d/$1" ] && { echo "$d/$1"; return; }
    done
}

prepare_weft() {
    if [ -n "${WEFT:-}" ]; then
        [ -x "$WEFT" ] || { SKIP[weft]="WEFT=$WEFT is not an executable"; return 1; }
    else
        command -v cargo >/dev/null || { SKIP[weft]="cargo not found and WEFT not set"; return 1; }
        log "building weft (cargo build --release -p weft in $ROOT)"
        if ! fg_run timeout 2400 cargo build --release -p weft --manifest-path "$ROOT/Cargo.toml" >"$RUN/weft-build.log" 2>&1; then
            tail -n 20 "$RUN/weft-build.log" >&2
            SKIP[weft]="cargo build --release -p weft failed (see output above)"; return 1
        fi
        WEFT="$ROOT/target/release/weft"
        log "weft build: $(grep -E '^ *Finished' "$RUN/weft-build.log" | tail -n1 | sed 's/^ *//')"
        WEFT_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || true)
    fi
    # Run a private copy so a concurrent rebuild cannot swap the binary mid-run.
    cp "$WEFT" "$RUN/weft"; WEFT_BIN="$RUN/weft"
    VERSION[weft]="$("$WEFT_BIN" --version 2>/dev/null | head -n1)${WEFT_REV:+ (built from git $WEFT_REV)}"
    if [ -n "${WEFT_A:-}" ]; then
        [ -x "$WEFT_A" ] || { SKIP[weft]="WEFT_A=$WEFT_A is not an executable"; return 1; }
        cp "$WEFT_A" "$RUN/weft-a"; WEFT_BIN_A="$RUN/weft-a"
        VERSION[weft]="node A: $("$WEFT_BIN_A" --version 2>/dev/null | head -n1); node B: ${VERSION[weft]}"
    fi
}

prepare_wg_common() { # TOOL
    apt_install wireguard-tools || { SKIP[$1]="apt-get install wireguard-tools failed"; return 1; }
    command -v wg >/dev/null || { SKIP[$1]="wg not found after installing wireguard-tools"; return 1; }
    if [ ! -f "$RUN/wg/a.key" ]; then
        mkdir -p "$RUN/wg"; (umask 077; wg genkey >"$RUN/wg/a.key"; wg genkey >"$RUN/wg/b.key")
        wg pubkey <"$RUN/wg/a.key" >"$RUN/wg/a.pub"; wg pubkey <"$RUN/wg/b.key" >"$RUN/wg/b.pub"
    fi
}

prepare_wireguard-go() {
    # The current wireguard-go, built from its Go module (TUN offload and UDP GSO/GRO
    # since 2023), not Debian's 2022 package; WIREGUARD_GO=PATH uses a given binary.
    # Without a Go toolchain (or a proxy to fetch the module) Debian's package runs and
    # the report says which one ran.
    local go cache="${XDG_CACHE_HOME:-$HOME/.cache}/weft-bench/wireguard-go"
    WGGO_BIN="${WIREGUARD_GO:-}"
    if [ -z "$WGGO_BIN" ]; then
        go=$(command -v go || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } || true)
        if [ -n "$go" ]; then
            if [ ! -x "$cache/bin/wireguard" ]; then
                log "building wireguard-go from its Go module (go install golang.zx2c4.com/wireguard@latest)"
                mkdir -p "$cache"
                if ! fg_run timeout 1200 env GOBIN="$cache/bin" GOPATH="$cache/gopath" GOFLAGS=-modcacherw \
                    "$go" install golang.zx2c4.com/wireguard@latest >>"$RUN/install.log" 2>&1; then
                    log "go install of wireguard-go failed (see $RUN/install.log); falling back to Debian's package"
                fi
            fi
            [ -x "$cache/bin/wireguard" ] && WGGO_BIN="$cache/bin/wireguard"
        fi
    fi
    if [ -n "$WGGO_BIN" ]; then
        local mod=""
        [ -n "${go:-}" ] && mod=$("$go" version -m "$WGGO_BIN" 2>/dev/null | awk '$1 == "mod" {print $3}')
        VERSION[wireguard-go]="$("$WGGO_BIN" --version 2>/dev/null | head -n1) (${mod:+Go module $mod}${WIREGUARD_GO:+ WIREGUARD_GO=$WIREGUARD_GO})"
    else
        apt_install wireguard-go || { SKIP[wireguard-go]="no Go toolchain and apt-get install wireguard-go failed"; return 1; }
        WGGO_BIN=$(command -v wireguard-go) || { SKIP[wireguard-go]="wireguard-go not found after install"; return 1; }
        VERSION[wireguard-go]="$("$WGGO_BIN" --version 2>/dev/null | head -n1) (Debian $(dpkg-query -W -f='${Version}' wireguard-go 2>/dev/null): no Go toolchain, so the 2022 package without TUN offload)"
    fi
    prepare_wg_common wireguard-go || return 1
}

prepare_boringtun() {
    BORINGTUN=$(cargo_bin boringtun-cli)
    if [ -z "$BORINGTUN" ]; then
        command -v cargo >/dev/null || { SKIP[boringtun]="boringtun-cli not installed and cargo not found"; return 1; }
        log "installing boringtun-cli (cargo install --locked boringtun-cli); this takes a few minutes"
        if ! fg_run timeout 2400 cargo install --locked boringtun-cli >>"$RUN/install.log" 2>&1; then
            tail -n 5 "$RUN/install.log" >&2
            SKIP[boringtun]="cargo install --locked boringtun-cli failed"; return 1
        fi
        BORINGTUN=$(cargo_bin boringtun-cli)
        [ -n "$BORINGTUN" ] || { SKIP[boringtun]="boringtun-cli not found after cargo install"; return 1; }
    fi
    prepare_wg_common boringtun || return 1
    VERSION[boringtun]=$("$BORINGTUN" --version 2>/dev/null | head -n1)
}

prepare_nebula() {
    apt_install nebula || { SKIP[nebula]="apt-get install nebula failed"; return 1; }
    if ! command -v nebula >/dev/null || ! command -v nebula-cert >/dev/null; then
        SKIP[nebula]="nebula/nebula-cert not found after install"; return 1
    fi
    local d="$RUN/nebula" side
    mkdir -p "$d"
    if ! ( cd "$d" && nebula-cert ca -name "weft-bench" -out-crt ca.crt -out-key ca.key \
        && nebula-cert sign -ca-crt ca.crt -ca-key ca.key -name a -ip 10.200.0.1/24 -out-crt a.crt -out-key a.key \
        && nebula-cert sign -ca-crt ca.crt -ca-key ca.key -name b -ip 10.200.0.2/24 -out-crt b.crt -out-key b.key ) >"$d/cert.log" 2>&1; then
        SKIP[nebula]="nebula-cert failed: $(tail -n1 "$d/cert.log")"; return 1
    fi
    for side in a b; do
        cat >"$d/$side.yml" <<EOF
pki:
  ca: $d/ca.crt
  cert: $d/$side.crt
  key: $d/$side.key
static_host_map:
  "10.200.0.1": ["198.51.100.1:4242"]
lighthouse:
  am_lighthouse: $([ "$side" = a ] && echo true || echo false)
  interval: 60
  hosts: [$([ "$side" = b ] && echo '"10.200.0.1"')]
listen:
  host: 0.0.0.0
  port: 4242
punchy:
  punch: false
  respond: false
relay:
  am_relay: false
  use_relays: false
tun:
  disabled: false
  dev: nb${TAG}${side}
  mtu: $MTU
logging:
  level: info
firewall:
  outbound:
    - port: any
      proto: any
      host: any
  inbound:
    - port: any
      proto: any
      host: any
EOF
    done
    VERSION[nebula]="$(nebula -version 2>/dev/null | head -n1) (Debian $(dpkg-query -W -f='${Version}' nebula 2>/dev/null))"
}

prepare_easytier() {
    # easytier-core on PATH, or installed from crates.io (cargo install easytier; it is
    # not packaged for Debian); skipped with the reason when neither works.
    EASYTIER=$(cargo_bin easytier-core)
    if [ -z "$EASYTIER" ]; then
        command -v cargo >/dev/null || { SKIP[easytier]="easytier-core not on PATH and cargo not found"; return 1; }
        # Its build script runs protoc (prost-build) on protos that import protobuf's
        # well-known types (google/protobuf/timestamp.proto: libprotobuf-dev, which
        # --no-install-recommends leaves out).
        if ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/timestamp.proto ]; then
            apt_install protobuf-compiler libprotobuf-dev || { SKIP[easytier]="protoc or protobuf's well-known types missing, and apt-get install protobuf-compiler libprotobuf-dev failed"; return 1; }
        fi
        log "installing EasyTier (cargo install --locked easytier); this takes a while"
        if ! fg_run timeout 3600 cargo install --locked easytier >>"$RUN/install.log" 2>&1; then
            tail -n 20 "$RUN/install.log" >&2
            SKIP[easytier]="cargo install --locked easytier failed (see output above)"; return 1
        fi
        EASYTIER=$(cargo_bin easytier-core)
        [ -n "$EASYTIER" ] || { SKIP[easytier]="easytier-core not found after cargo install"; return 1; }
    fi
    VERSION[easytier]=$("$EASYTIER" --version 2>/dev/null | head -n1)
}

ACTIVE=()
for t in "${TOOLS[@]}"; do
    if "prepare_$t"; then ACTIVE+=("$t"); else log "skipping $t: ${SKIP[$t]}"; fi
done
VERSION[iperf3]=$(iperf3 --version 2>/dev/null | head -n1)

# ---------------------------------------------------------------------------------------
# Topology: two namespaces, one veth pair, nothing else.
ip netns add "$NS_A"; NS_MADE=1
ip netns add "$NS_B"
ip link add eth0 netns "$NS_A" type veth peer name eth0 netns "$NS_B"
ip -n "$NS_A" addr add 198.51.100.1/24 dev eth0
ip -n "$NS_B" addr add 198.51.100.2/24 dev eth0
for ns in "$NS_A" "$NS_B"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
done

# Whether every tunnel process under test is still running (none before a tool starts).
alive_all() { local p; for p in "${TUN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done; }
wait_for() { # DEADLINE_S CMD...: poll CMD every 0.2 s until it succeeds (0), the deadline
    # passes (1) or one of the tunnel processes under test exits (2).
    local end=$(( $(date +%s) + $1 )); shift
    while :; do
        "$@" >/dev/null 2>&1 && return 0
        alive_all || return 2
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}

# ready DEADLINE_S WHAT CMD...: wait_for, and on failure set START_ERR to a useful reason.
ready() {
    local secs=$1 what=$2 rc=0; shift 2
    wait_for "$secs" "$@" || rc=$?
    case "$rc" in
        0) return 0 ;;
        2) START_ERR="a tunnel process exited before $what: $(dead_tail)" ;;
        *) START_ERR="$what did not happen within ${secs}s" ;;
    esac
    return 1
}

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
if [ "$LATENCY" = 1 ]; then
    ip netns exec "$NS_A" "$PY" "$LATENCY_PY" echo 9000 >"$RUN/echo.log" 2>&1 &
    DAEMON_PIDS+=($!)
fi

ping_b_to_a() { ip netns exec "$NS_B" ping -c 1 -W 1 -q "$1"; }

# ---------------------------------------------------------------------------------------
# Tunnel start/stop. Each start_* fills TUN_PIDS, waits on a readiness condition with a
# deadline and returns non-zero (with START_ERR) if the tunnel did not come up.
LOGS="$RUN/logs"; mkdir -p "$LOGS"
START_ERR=""
WEFT_EXPECT=""; WEFT_CTL=""; WEFT_CTL_A=""; WEFT_TRANSPORT_ERR=""

stop_tunnel() {
    local p
    WEFT_EXPECT=""
    for p in "${TUN_PIDS[@]}"; do kill_pid "$p"; done
    TUN_PIDS=()
}

declare -A PID_LOG=()
spawn() { # LOG NS CMD...: start CMD in namespace NS as a tunnel process of the tool under test
    local logf=$1 ns=$2; shift 2
    : >"$logf"
    ip netns exec "$ns" "$@" >>"$logf" 2>&1 &
    TUN_PIDS+=($!)
    PID_LOG[$!]=$logf
}
dead_tail() { # "NAME exited: last log line" for the first tunnel process that is gone
    local p
    for p in "${TUN_PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null && continue
        local line
        line=$(grep -i 'error' "${PID_LOG[$p]}" | tail -n1)
        [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' "${PID_LOG[$p]}" | tail -n1)
        echo "${PID_LOG[$p]##*/}: ${line:0:200}"
        return
    done
}

# Listener and peer URI of each transport (the ports of weft's default listeners).
weft_listen() { case "$1" in udp|tcp|ipv6) echo "${1/ipv6/udp}://0.0.0.0:11010" ;; ws) echo "ws://0.0.0.0:11011" ;; *) echo "$1://0.0.0.0:11012" ;; esac; }
weft_peer_uri() { # TRANSPORT HOST
    case "$1" in udp|tcp|ipv6) echo "${1/ipv6/udp}://$2:11010" ;; ws) echo "ws://$2:11011/" ;; wss) echo "wss://$2:11012/" ;; quic) echo "quic://$2:11012" ;; esac
}

start_weft() { # CIPHER TRANSPORT REP
    local cipher=$1 tr=$2 d="$RUN/weft-$1-$2-r$3" listen v6a="" v6b=""
    mkdir -p "$d"
    listen=$(weft_listen "$tr")
    # The "ipv6" row: UDP underlay, explicit IPv6 overlay addresses (iperf3 targets A's).
    if [ "$tr" = ipv6 ]; then v6a="--ipv6 fd00:200::1/64"; v6b="--ipv6 fd00:200::2/64"; fi
    export WEFT_NETWORK_SECRET="bench-secret-$$"   # from the environment: stays out of ps
    # Both nodes listen on this one transport only, so neither can pick a better one.
    # shellcheck disable=SC2086  # WEFT_FLAGS is a list of flags
    spawn "$LOGS/weft-$cipher-$tr-a.log" "$NS_A" "${WEFT_BIN_A:-$WEFT_BIN}" up --network-name bench -i 10.200.0.1/24 \
        -l "$listen" --state-dir "$d/a" --control "$d/a.sock" --cipher "$cipher" $v6a $WEFT_FLAGS
    # shellcheck disable=SC2086
    spawn "$LOGS/weft-$cipher-$tr-b.log" "$NS_B" "$WEFT_BIN" up --network-name bench -i 10.200.0.2/24 \
        -l "$listen" -p "$(weft_peer_uri "$tr" 198.51.100.1)" --state-dir "$d/b" --control "$d/b.sock" \
        --cipher "$cipher" $v6b $WEFT_FLAGS
    WEFT_CTL_A="$d/a.sock"; WEFT_CTL="$d/b.sock"; WEFT_EXPECT=${tr/ipv6/udp}
    ready 20 "an established peer in 'weft status --json'" weft_established || return 1
    ready 10 "a ping reply from 10.200.0.1" ping_b_to_a 10.200.0.1 || return 1
    if [ "$tr" = ipv6 ]; then ready 10 "a ping reply from fd00:200::1" ping_b_to_a fd00:200::1 || return 1; fi
    weft_check_transport || { START_ERR="$WEFT_TRANSPORT_ERR"; return 1; }
}
weft_established() {
    "$WEFT_BIN" status --control "$WEFT_CTL" --json 2>/dev/null | grep -Eq '"state": *"established"'
}
# weft_check_transport: both nodes see each other established, direct, over $WEFT_EXPECT;
# otherwise WEFT_TRANSPORT_ERR says what they show instead.
weft_check_transport() {
    local side ctl peer got
    WEFT_TRANSPORT_ERR=""
    for side in a b; do
        if [ "$side" = a ]; then ctl=$WEFT_CTL_A; peer=10.200.0.2; else ctl=$WEFT_CTL; peer=10.200.0.1; fi
        got=$("$WEFT_BIN" status --control "$ctl" --json 2>/dev/null | "$PY" "$REPORT" peer --overlay "$peer" 2>&1) || got="no status ($got)"
        if [ "$got" != "established direct $WEFT_EXPECT" ]; then
            WEFT_TRANSPORT_ERR="node $side sees its peer as '$got', expected 'established direct $WEFT_EXPECT'"
            return 1
        fi
    done
}
weft_save_status() { # TAG: keep both nodes' `weft status --json` (drops, transport counters)
    "$WEFT_BIN" status --control "$WEFT_CTL_A" --json >"$LOGS/$1-a.status.json" 2>&1 || true
    "$WEFT_BIN" status --control "$WEFT_CTL" --json >"$LOGS/$1-b.status.json" 2>&1 || true
}

start_wg_like() { # TOOL(wireguard-go|boringtun) REP
    local tool=$1 pfx side ns ifn key peerpub myip peerip endpoint
    if [ "$tool" = wireguard-go ]; then pfx=wg; else pfx=bt; fi
    for side in a b; do
        if [ "$side" = a ]; then ns=$NS_A; myip=10.200.0.1; peerip=10.200.0.2; endpoint=198.51.100.2:51820; key=a; peerpub=b
        else ns=$NS_B; myip=10.200.0.2; peerip=10.200.0.1; endpoint=198.51.100.1:51820; key=b; peerpub=a; fi
        ifn="${pfx}${TAG}${side}"
        UAPI_SOCKS+=("/var/run/wireguard/$ifn.sock")
        if [ "$tool" = wireguard-go ]; then
            spawn "$LOGS/$tool-$side.log" "$ns" env WG_PROCESS_FOREGROUND=1 "$WGGO_BIN" -f "$ifn"
        else
            spawn "$LOGS/$tool-$side.log" "$ns" "$BORINGTUN" -f --disable-drop-privileges -v error \
                -l "$LOGS/$tool-$side.log" "$ifn"
        fi
        ready 10 "the UAPI socket of $ifn" test -S "/var/run/wireguard/$ifn.sock" || return 1
        ready 5 "interface $ifn" ip -n "$ns" link show "$ifn" || return 1
        ip netns exec "$ns" wg set "$ifn" listen-port 51820 private-key "$RUN/wg/$key.key" \
            peer "$(cat "$RUN/wg/$peerpub.pub")" allowed-ips "$peerip/32" endpoint "$endpoint" \
            || { START_ERR="wg set $ifn failed"; return 1; }
        if ! { ip -n "$ns" addr add "$myip/24" dev "$ifn" && ip -n "$ns" link set "$ifn" mtu "$MTU" up; }; then
            START_ERR="could not configure $ifn"; return 1
        fi
    done
    ready 20 "a ping reply from 10.200.0.1" ping_b_to_a 10.200.0.1
}

start_nebula() { # REP
    spawn "$LOGS/nebula-a.log" "$NS_A" nebula -config "$RUN/nebula/a.yml"
    spawn "$LOGS/nebula-b.log" "$NS_B" nebula -config "$RUN/nebula/b.yml"
    ready 20 "a ping reply from 10.200.0.1" ping_b_to_a 10.200.0.1
}

start_easytier() { # REP
    local secret="bench-secret-$$"
    spawn "$LOGS/easytier-a.log" "$NS_A" env ET_NETWORK_SECRET="$secret" "$EASYTIER" --network-name bench \
        -i 10.200.0.1/24 --listeners udp://0.0.0.0:11010 --dev-name "et${TAG}a"
    spawn "$LOGS/easytier-b.log" "$NS_B" env ET_NETWORK_SECRET="$secret" "$EASYTIER" --network-name bench \
        -i 10.200.0.2/24 --listeners udp://0.0.0.0:11010 --dev-name "et${TAG}b" -p udp://198.51.100.1:11010
    ready 30 "a ping reply from 10.200.0.1" ping_b_to_a 10.200.0.1
}

# ---------------------------------------------------------------------------------------
# Measurement of one iperf3 run, with CPU and peak RSS of the tunnel processes.
cpu_ticks() { # PIDS...: utime+stime of all threads, summed over the processes
    local p sum=0 t
    for p in "$@"; do
        t=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || t=0
        sum=$((sum + ${t:-0}))
    done
    echo "$sum"
}
reset_peak_rss() { # PIDS...: VmHWM back to the current RSS (the run's peak is measured)
    local p
    for p in "$@"; do echo 5 >"/proc/$p/clear_refs" 2>/dev/null || true; done
}
peak_rss_kib() { # PIDS...: max VmHWM
    local p max=0 v
    for p in "$@"; do
        v=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null) || v=0
        [ "${v:-0}" -gt "$max" ] && max=$v
    done
    echo "$max"
}

RUNS="$RUN/runs.jsonl"; : >"$RUNS"
measure() { # REP TOOL MODE TARGET STREAMS DIR(b-to-a|a-to-b)
    local rep=$1 tool=$2 mode=$3 target=$4 streams=$5 dir=$6 rflag=() t0 t1 c0 c1 rss=0 cpu="" rc=0 json note=""
    [ "$dir" = a-to-b ] && rflag=(-R)
    if [ -n "$WEFT_EXPECT" ] && ! weft_check_transport; then
        # Loudly: a number measured over another transport than the row's would mislead.
        log "ERROR: $tool ($mode) rep $rep -P $streams $dir: wrong transport: $WEFT_TRANSPORT_ERR"
        "$PY" "$REPORT" record --failed "wrong transport: $WEFT_TRANSPORT_ERR" --rep "$rep" --tool "$tool" \
            --mode "$mode" --streams "$streams" --direction "$dir" --duration "$DURATION" >>"$RUNS"
        tail -n1 "$RUNS" | "$PY" "$REPORT" line >&2 || true
        return
    fi
    json="$RUN/iperf-r$rep-$tool-$mode-P$streams-$dir.json"
    # The loopback baseline (what EasyTier's table and the tun-rs benchmark quote their
    # tunnels against) runs client and server in A over lo.
    local client_ns=$NS_B
    [ "$tool" = loopback ] && client_ns=$NS_A
    [ "${#TUN_PIDS[@]}" -gt 0 ] && reset_peak_rss "${TUN_PIDS[@]}"
    c0=$(cpu_ticks "${TUN_PIDS[@]}"); t0=$(date +%s.%N)
    fg_run timeout $((DURATION + 30)) ip netns exec "$client_ns" iperf3 -c "$target" -p 5201 -J -t "$DURATION" \
        -P "$streams" "${rflag[@]}" --connect-timeout 5000 >"$json" 2>"$json.err" || rc=$?
    t1=$(date +%s.%N); c1=$(cpu_ticks "${TUN_PIDS[@]}")
    if [ "${#TUN_PIDS[@]}" -gt 0 ]; then
        rss=$(peak_rss_kib "${TUN_PIDS[@]}")
        cpu=$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", (b - a) / hz / (t1 - t0) * 100 }')
        alive_all || note="a tunnel process exited during the run"
    fi
    if [ -n "$WEFT_EXPECT" ] && [ -z "$note" ] && ! weft_check_transport; then
        note="transport changed during the run: $WEFT_TRANSPORT_ERR"
        log "ERROR: $tool ($mode) rep $rep: $note"
    fi
    "$PY" "$REPORT" record --iperf "$json" --rc "$rc" --rep "$rep" --tool "$tool" --mode "$mode" \
        --streams "$streams" --direction "$dir" --duration "$DURATION" --cpu "$cpu" --rss-kib "$rss" \
        --version "${VERSION[$tool]:-}" --note "$note" >>"$RUNS" || true
    tail -n1 "$RUNS" | "$PY" "$REPORT" line >&2 || true
    if [ "$rc" != 0 ]; then
        # A failed or timed-out client can leave the server stuck in a test; start afresh.
        restart_iperf_server
    fi
}

# Latency (LATENCY=1, bench/netns/latency.sh): PINGS pings 10 ms apart B -> A with the
# tunnel idle; then one iperf3 stream B -> A for DURATION s with, from its second second,
# pings 10 ms apart and the game flow (50 packets/s of 100 bytes, echoed by A) beside it.
measure_latency() { # REP TOOL MODE TARGET
    local rep=$1 tool=$2 mode=$3 target=$4 base rc=0 n note="" ping=(ping)
    base="$RUN/lat-r$rep-$tool-${mode// /_}"
    [[ "$target" == *:* ]] && ping=(ping -6)
    fg_run timeout $((PINGS / 100 + 20)) ip netns exec "$NS_B" "${ping[@]}" -i 0.01 -W 1 -c "$PINGS" "$target" \
        >"$base.idle" 2>&1 || true
    # shellcheck disable=SC2086  # IPERF_FLAGS is a list of flags
    ip netns exec "$NS_B" iperf3 -c "$target" -p 5201 -J -t "$DURATION" --connect-timeout 5000 $IPERF_FLAGS \
        >"$base.iperf" 2>"$base.iperf.err" &
    local bulk=$!
    DAEMON_PIDS+=("$bulk")
    sleep 1
    n=$(( (DURATION - 2) * 100 ))
    ip netns exec "$NS_B" "$PY" "$LATENCY_PY" game "$target" 9000 "$((DURATION - 2))" "$base.game" &
    local game=$!
    DAEMON_PIDS+=("$game")
    fg_run timeout $((DURATION + 20)) ip netns exec "$NS_B" "${ping[@]}" -i 0.01 -W 1 -c "$n" "$target" \
        >"$base.loaded" 2>&1 || true
    wait "$game" 2>/dev/null || true
    wait "$bulk" 2>/dev/null || rc=$?
    local keep=() p
    for p in "${DAEMON_PIDS[@]}"; do [ "$p" = "$bulk" ] || [ "$p" = "$game" ] || keep+=("$p"); done
    DAEMON_PIDS=("${keep[@]}")
    [ "${#TUN_PIDS[@]}" -gt 0 ] && ! alive_all && note="a tunnel process exited during the run"
    "$PY" "$LATENCY_PY" record --rep "$rep" --tool "$tool" --mode "$mode" --idle "$base.idle" \
        --loaded "$base.loaded" --game "$base.game" --iperf "$base.iperf" --note "$note" >>"$RUNS" || true
    tail -n1 "$RUNS" | "$PY" "$LATENCY_PY" line >&2 || true
    [ "$rc" = 0 ] || restart_iperf_server
}

record_failure() { # REP TOOL MODE REASON
    local s dir
    for s in $STREAMS; do for dir in b-to-a a-to-b; do
        "$PY" "$REPORT" record --failed "$4" --rep "$1" --tool "$2" --mode "$3" --streams "$s" \
            --direction "$dir" --duration "$DURATION" >>"$RUNS"
    done; done
}

run_variant() { # REP TOOL MODE [TRANSPORT]
    local rep=$1 tool=$2 mode=$3 target=10.200.0.1 s dir ok=0
    START_ERR=""
    case "$tool" in
        direct) target=198.51.100.1; ok=1 ;;
        loopback) target=127.0.0.1; ok=1 ;;
        weft) start_weft "$mode" "$4" "$rep" && ok=1; mode="$mode over $4"
            [ "$4" = ipv6 ] && target=fd00:200::1 ;;
        wireguard-go|boringtun) start_wg_like "$tool" "$rep" && ok=1 ;;
        nebula) start_nebula "$rep" && ok=1 ;;
        easytier) start_easytier "$rep" && ok=1 ;;
    esac
    if [ "$ok" = 1 ] && [ "$LATENCY" = 1 ]; then
        measure_latency "$rep" "$tool" "$mode" "$target"
        [ "$tool" = weft ] && weft_save_status "weft-${mode// over /-}"
    elif [ "$ok" = 1 ]; then
        for s in $STREAMS; do for dir in b-to-a a-to-b; do
            measure "$rep" "$tool" "$mode" "$target" "$s" "$dir"
        done; done
        [ "$tool" = weft ] && weft_save_status "weft-${mode// over /-}"
    else
        log "$tool ($mode) rep $rep: did not come up: $START_ERR"
        record_failure "$rep" "$tool" "$mode" "$START_ERR"
        [ "$tool" = weft ] && weft_save_status "failed-r$rep-weft-${mode// over /-}"
        for f in "$LOGS/$tool"-*.log; do [ -f "$f" ] && cp "$f" "$LOGS/failed-r$rep-${f##*/}"; done
    fi
    stop_tunnel
}

for rep in $(seq "$REPS"); do
    log "repetition $rep/$REPS"
    run_variant "$rep" direct veth
    [ "$LATENCY" = 1 ] || run_variant "$rep" loopback lo
    for t in "${ACTIVE[@]}"; do
        case "$t" in
            weft) for v in "${WEFT_VARIANTS[@]}"; do run_variant "$rep" weft "${v% *}" "${v#* }"; done ;;
            wireguard-go|boringtun) run_variant "$rep" "$t" chacha20-poly1305 ;;
            nebula) run_variant "$rep" nebula aes-256-gcm ;;
            easytier) run_variant "$rep" easytier default ;;
        esac
    done
done

# ---------------------------------------------------------------------------------------
# Report.
mkdir -p "$OUT"
rm -rf "$OUT/logs"; cp -r "$LOGS" "$OUT/logs"
for f in install.log weft-build.log; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/logs/"; done
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cmdline=$CMDLINE"
    echo "nproc=$(nproc)"
    echo "kernel=$(uname -srm)"
    echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
    echo "memory=$(awk '/^MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    # shellcheck disable=SC1091
    echo "os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")"
    echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "reps=$REPS"; echo "duration=$DURATION"; echo "streams=$STREAMS"; echo "mtu=$MTU"
    echo "weft_flags=$WEFT_FLAGS"; echo "weft_transports=$WEFT_TRANSPORTS"; echo "quick=$QUICK"
    for k in "${!VERSION[@]}"; do echo "version.$k=${VERSION[$k]}"; done
    for k in "${!SKIP[@]}"; do echo "skip.$k=${SKIP[$k]}"; done
} >"$RUN/meta.txt"
if [ "$LATENCY" = 1 ]; then
    "$PY" "$LATENCY_PY" report --runs "$RUNS" --meta "$RUN/meta.txt" --out "$OUT"
    log "wrote $OUT/latency.md, $OUT/latency.json, $OUT/latency.svg"
else
    "$PY" "$REPORT" report --runs "$RUNS" --meta "$RUN/meta.txt" --out "$OUT"
    log "wrote $OUT/results.md, $OUT/results.json, $OUT/chart.svg"
fi
