import re,sys,statistics as st,collections
f=sys.argv[1]; pat=sys.argv[2]
tids=set()
lines=open(f).read().splitlines()
for l in lines:
    for m in re.finditer(r'(?:prev|next)_comm=(\S+) (?:prev|next)_pid=(\d+)',l):
        if re.match(pat,m[1]): tids.add(m[2])
last_exit={}; enter={}; dur=collections.defaultdict(list); gap=collections.defaultdict(list)
NAMES={0:'read',1:'write',44:'sendto',45:'recvfrom',46:'sendmsg',47:'recvmsg',232:'epoll_wait',299:'recvmmsg',307:'sendmmsg',327:'preadv2',202:'futex',7:'poll',281:'epoll_pwait',20:'writev',19:'readv'}
for l in lines:
    m=re.match(r'\s*(\d+) \[\d+\] ([0-9.]+):\s+raw_syscalls:sys_(enter|exit): NR (\d+)',l)
    if not m or m[1] not in tids: continue
    tid,t,k,nr=m[1],float(m[2]),m[3],int(m[4])
    if k=='enter':
        if tid in last_exit:
            pn,pt=last_exit[tid]
            if t-pt<0.002: gap[NAMES.get(pn,pn),NAMES.get(nr,nr)].append(t-pt)
        enter[tid]=(nr,t)
    else:
        if tid in enter and enter[tid][0]==nr:
            d=t-enter[tid][1]
            if d<0.002: dur[NAMES.get(nr,nr)].append(d)
        last_exit[tid]=(nr,t)
print('syscall durations (<2ms) median us, n')
for k,v in sorted(dur.items(),key=lambda kv:-len(kv[1]))[:10]: print(f'  {k!s:12} {1e6*st.median(v):7.1f} {len(v)}')
print('userspace gaps exit->enter median us, n')
for k,v in sorted(gap.items(),key=lambda kv:-len(kv[1]))[:12]: print(f'  {k!s:28} {1e6*st.median(v):7.1f} {len(v)}')
