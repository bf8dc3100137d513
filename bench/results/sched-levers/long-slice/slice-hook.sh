# usage: slice-hook.sh SLICE_NS PID... ; sets the slice of every weft-tx/rx thread
S=$1; shift
for p in "$@"; do for t in /proc/$p/task/*; do c=$(cat $t/comm 2>/dev/null); case "$c" in ${PAT:-weft-tx-*|weft-rx-*}) /tmp/udpx/target/release/setslice -10 $S ${t##*/};; esac; done; done
