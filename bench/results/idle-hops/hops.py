import re,sys,subprocess,statistics as st
f=sys.argv[1]
out=subprocess.run(['perf','sched','timehist','-i',f,'-w'],capture_output=True,text=True).stdout.splitlines()
ev=[]
for l in out:
    m=re.match(r'\s*([0-9.]+)\s+\[(\d+)\]\s+(\S+)\s+awakened: (\S+)',l)
    if m: ev.append(('w',float(m[1]),int(m[2]),m[3],m[4])); continue
    m=re.match(r'\s*([0-9.]+)\s+\[(\d+)\]\s+(\S+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)',l)
    if m: ev.append(('s',float(m[1]),int(m[2]),m[3],float(m[4]),float(m[5]),float(m[6])))
# cycles: start at ping awakening someone (ping sends), end at someone awakening ping
name=lambda s: re.sub(r'\[\d+(/\d+)?\]','',s)
cycles=[];cur=None
for e in ev:
    if e[0]=='w' and e[3].startswith('ping[') and not cur:
        cur=[e]
    elif cur is not None:
        cur.append(e)
        if e[0]=='w' and e[4].startswith('ping['):
            cycles.append(cur);cur=None
segs={}
for c in cycles:
    t0=c[0][1]; tend=c[-1][1]
    segs.setdefault('total',[]).append(tend-t0)
    # wake->run delays and cross cpu per wakee
    for e in c:
        if e[0]=='w':
            wakee=e[4]
            # find when wakee starts: first 's' line of wakee after e: start = time - runtime
            for x in c:
                if x[0]=='s' and x[3]==wakee and x[1]>e[1]:
                    start=x[1]-x[6]/1000
                    k=name(e[3])+'->'+name(wakee)
                    segs.setdefault(k,[]).append((start-e[1], x[2]!=e[2]))
                    break
print('cycles',len(cycles),'total median %.3f ms'%(1000*st.median(segs['total'])))
for k,v in sorted(segs.items()):
    if k=='total': continue
    d=[a for a,b in v]; x=sum(1 for a,b in v if b)
    print(f'{k:45s} n={len(v):3d} wake->run med {1000*st.median(d):.3f} ms  cross-cpu {x}')
print('--- chains')
import collections
pos=collections.defaultdict(list)
for c in cycles:
    t0=c[0][1]
    ws=[(round((e[1]-t0)*1e6),e[2],name(e[3])+'>'+name(e[4])) for e in c if e[0]=='w' and 'rcu' not in e[4] and 'kworker' not in e[4]]
    key=' '.join(w[2] for w in ws)
    pos[key].append([w[0] for w in ws])
for k,v in sorted(pos.items(),key=lambda kv:-len(kv[1]))[:4]:
    med=[st.median(x[i] for x in v) for i in range(len(v[0]))]
    print(len(v),k); print('   us:',med)
