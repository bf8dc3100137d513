# Process helpers shared by the netns benchmarks (compare.sh, loss.sh). Sourced; they
# only ever signal PIDs the calling script started. IN_CLEANUP is the caller's flag.

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
