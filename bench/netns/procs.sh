# Process helpers shared by the netns benchmarks (compare.sh, loss.sh, mesh.sh; the others
# use start_watchdog). Sourced; they only ever signal PIDs the calling script started.
# IN_CLEANUP is the caller's flag.

proc_alive() { # PID: running (not gone, not a zombie); forks nothing, so safe inside traps
    local st
    [ -r "/proc/$1/stat" ] || return 1
    read -r st <"/proc/$1/stat" 2>/dev/null || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}

kill_pid() { # PID: TERM, wait up to 3 s, then KILL
    local p=$1 i
    [ -n "$p" ] || return 0
    kill -TERM "$p" 2>/dev/null || return 0
    for ((i = 0; i < 30; i++)); do proc_alive "$p" || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    # Reap it, except in cleanup: there `wait` can block forever in bash 5.2 when the
    # child was already reaped while the trap ran (other children, like iperf3 -s, live on).
    [ "$IN_CLEANUP" = 1 ] || wait "$p" 2>/dev/null || true
}

# Traps: cleanup (the caller's) on exit; INT and TERM print why and exit, which runs it.
# No command substitution and no `wait` in these handlers or in cleanup (see kill_pid).
# They write to fd 9, the original stderr: a trap runs inside whatever redirection the
# interrupted command had (often >/dev/null).
install_traps() {
    exec 9>&2
    trap cleanup EXIT
    trap 'printf "interrupted; cleaning up\n" >&9; exit 130' INT
    trap 'printf "stopped by SIGTERM (MAX_RUNTIME=%s reached, or killed); cleaning up\n" "${MAX_RUNTIME:-?}" >&9; exit 143' TERM
}

# Runs a command in the background and waits for it, so that a signal (the watchdog's
# TERM, ^C) interrupts the wait at once and the trap can kill the command.
fg_run() {
    local rc=0
    "$@" & CUR_PID=$!
    wait "$CUR_PID" || rc=$?
    CUR_PID=""
    return "$rc"
}

# Bounded runtime: TERMs this script after MAX_RUNTIME seconds; sets WATCHDOG_PID. Its
# sleep is killed with it and it holds no stdout/stderr, so nothing outlives the script.
start_watchdog() {
    (
        sleep "$MAX_RUNTIME" & sp=$!
        trap 'kill "$sp" 2>/dev/null; exit 0' TERM
        wait "$sp" && kill -TERM $$ 2>/dev/null
    ) </dev/null >/dev/null 2>&1 &
    WATCHDOG_PID=$!
}

# Stops every PID in the array named $1 (TERM, then reaps each) and empties the array:
# the weft nodes or helpers of a script that keeps them in arrays (relay.sh, memory.sh).
stop_all() {
    local -n pids_=$1
    local pid
    for pid in "${pids_[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids_[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids_=()
}

# Makes each named network namespace with its loopback up (first.sh, uplink.sh).
make_netns() {
    local ns
    for ns in "$@"; do
        ip netns add "$ns"
        ip netns exec "$ns" ip link set lo up
    done
}

# Ends whatever still runs in each named namespace and deletes it; never fails, so it
# is safe in cleanup (first.sh, uplink.sh).
remove_netns() {
    local ns
    for ns in "$@"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}
