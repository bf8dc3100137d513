#!/bin/bash
# quick experiment: weft pair in two namespaces, loaded ping. usage: pair.sh WEFT_BIN OUTDIR [extra cmd run during load]
set -u
W=$1; O=$2; EXTRA=${3:-}; DUR=${DUR:-8}; TR=${TR:-udp}
mkdir -p $O; A=xp$$a; B=xp$$b; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; sleep 0.3; ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; }
trap cleanup EXIT
ip netns add $A; ip netns add $B
ip link add va$$ netns $A type veth peer name vb$$ netns $B
ip -n $A addr add 198.51.100.1/24 dev va$$; ip -n $B addr add 198.51.100.2/24 dev vb$$
ip -n $A link set va$$ up; ip -n $B link set vb$$ up; ip -n $A link set lo up; ip -n $B link set lo up
export WEFT_NETWORK_SECRET=xp-secret-$$
port=11010; [ $TR = ws ] && port=11011
ip netns exec $A $W up --network-name xp -i 10.200.0.1/24 -l $TR://0.0.0.0:$port --state-dir $O/a --control $O/a.sock $WFLAGS >$O/a.log 2>&1 & PIDS+=($!)
peer=$TR://198.51.100.1:$port; [ $TR = ws ] && peer=ws://198.51.100.1:$port/
ip netns exec $B $W up --network-name xp -i 10.200.0.2/24 -l $TR://0.0.0.0:$port -p $peer --state-dir $O/b --control $O/b.sock $WFLAGS >$O/b.log 2>&1 & PIDS+=($!)
for i in $(seq 50); do ip netns exec $B ping -c1 -W1 -q 10.200.0.1 >/dev/null 2>&1 && break; sleep 0.2; done
[ -n "${HOOK:-}" ] && eval "$HOOK"
ip netns exec $A iperf3 -s -p 5201 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.5
ip netns exec $B ping -i 0.01 -c 200 10.200.0.1 > $O/idle.txt
ip netns exec $B iperf3 -c 10.200.0.1 -p 5201 -t $DUR $IPERF_FLAGS > $O/iperf.txt 2>&1 & IP=$!
sleep 1
ip netns exec $B ping -i 0.01 -c $(( (DUR-2)*100 )) 10.200.0.1 > $O/loaded.txt & PP=$!
if [ -n "$EXTRA" ]; then sleep 1; eval "$EXTRA"; fi
wait $PP; wait $IP
python3 - $O <<'PY'
import re,sys
o=sys.argv[1]
def st(f):
    v=sorted(float(x) for x in re.findall(r'time=([0-9.]+)',open(f).read()))
    if not v: return 'none'
    q=lambda p:v[min(len(v)-1,int(p*len(v)))]
    return f'p50 {q(.5):.3f} p90 {q(.9):.3f} p99 {q(.99):.3f} n {len(v)}'
print('idle  ',st(o+'/idle.txt'))
print('loaded',st(o+'/loaded.txt'))
t=open(o+'/iperf.txt').read(); m=re.findall(r'([0-9.]+) Gbits/sec.*sender',t); print('bulk',m)
PY
