#!/usr/bin/env bash
# The web console's own cost: RSS and CPU of `weft web` serving the status of N
# members (default 200) to one browser-like client for DURATION seconds (default 60):
# the status page every 2 s and the event stream (one event a second), as the
# console's page asks. The node is node 0 of a simulated mesh of N+1 real engines
# (meshsim --control: it answers Request::Status from its engine while the mesh runs
# on in step with the wall clock, sending a little traffic); NODE=fake takes the
# stand-in socket instead (fake_node.py: N members in the status's shape). Everything
# is on loopback and Unix sockets.
#
#   bench/web/cost.sh [N] [DURATION]   (WEFT=path/to/weft, default target/release/weft;
#                                       MESHSIM=path/to/meshsim, default beside WEFT)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-200}
DURATION=${2:-60}
WEFT=${WEFT:-target/release/weft}
MESHSIM=${MESHSIM:-$(dirname "$WEFT")/meshsim}
NODE=${NODE:-meshsim}
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
if [ "$NODE" = fake ]; then
    python3 bench/web/fake_node.py "$DIR/weft.sock" "$N" &
    PIDS+=($!)
    wait_s=5
else
    # Node 0 and N members; the socket appears once the mesh has converged.
    "$MESHSIM" --nodes $((N + 1)) --seed 1 --steady-s 1 --control "$DIR/weft.sock" --serve-s $((DURATION + 600)) \
        >"$DIR/meshsim.out" 2>"$DIR/meshsim.err" &
    PIDS+=($!)
    wait_s=600
fi
for _ in $(seq $((wait_s * 10))); do [ -S "$DIR/weft.sock" ] && break; sleep 0.1; done
[ -S "$DIR/weft.sock" ] || { echo "cost.sh: no control socket after ${wait_s} s" >&2; cat "$DIR"/meshsim.* >&2 2>/dev/null; exit 1; }
"$WEFT" web --listen 127.0.0.1:0 --control "$DIR/weft.sock" >"$DIR/url" 2>"$DIR/web.log" &
WEB=$!
PIDS+=("$WEB")
for _ in $(seq 50); do [ -s "$DIR/url" ] && break; sleep 0.1; done
URL=$(head -1 "$DIR/url")
BASE=${URL%%/\?*}
curl -s -o /dev/null -c "$DIR/jar" "$URL"
curl -s -N -b "$DIR/jar" "$BASE/api/events" >"$DIR/events" &
PIDS+=($!)
ticks() { awk '{print $14 + $15}' "/proc/$WEB/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks)
start=$(date +%s.%N)
bytes=0
for _ in $(seq $((DURATION / 2))); do
    n=$(curl -s -b "$DIR/jar" "$BASE/api/status" | wc -c)
    bytes=$((bytes + n))
    sleep 2
done
end=$(date +%s.%N)
# Members the last status named (the node's peers).
seen=$(curl -s -b "$DIR/jar" "$BASE/api/status" | python3 -c 'import json, sys; s = json.load(sys.stdin); print(len((s.get("status") or s)["peers"]))')
t1=$(ticks)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$WEB/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$WEB/status")
events=$(grep -c '^event: traffic' "$DIR/events" || true)
python3 - "$N" "$t0" "$t1" "$hz" "$start" "$end" "$rss" "$hwm" "$bytes" "$events" "$((DURATION / 2))" "$seen" <<'PY'
import sys
n, t0, t1, hz, s, e, rss, hwm, b, ev, req, seen = sys.argv[1:]
wall = float(e) - float(s)
cpu = (int(t1) - int(t0)) / int(hz)
print(f"members={n} wall_s={wall:.1f} cpu_s={cpu:.2f} cpu_pct={100*cpu/wall:.2f} rss_kib={rss} peak_rss_kib={hwm} "
      f"status_requests={req} status_bytes_each={int(b)//int(req)} events={ev} members_in_status={seen}")
PY
