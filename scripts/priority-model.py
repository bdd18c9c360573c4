#!/usr/bin/env python3
# A design model for priority classes (issue 36), not a test and not run by CI:
# a discrete-event simulation of C = 64 units, exponential service (mean S),
# Poisson arrivals in three classes (20 / 50 / 30 % high / medium / low, the
# issue's mix), at 1.5x, 2x and 4x of capacity, under admission rules the
# engine could implement. Two parts:
#
# 1. Fail fast (no waiting): plain (classes ignored), static headroom
#    (a lower class admitted only below a fraction of C), trunk reservation
#    (below C minus r units), and an adaptive reserve (a lower class keeps
#    free what the classes above it are expected to need and do not hold
#    yet: their arrival rate x S, Little's law, plus z standard deviations).
# 2. A bounded wait with a class-ordered room (a freed unit goes to the
#    oldest waiter of the highest class), with and without that reserve.
#
# Usage: python3 scripts/priority-model.py   (about a minute)
import heapq, random, math, sys
C=64; S=1.0
MIX=[0.2,0.5,0.3]  # high, med, low
def run(load, policy, T=3000, seed=1):
    rng=random.Random(seed)
    lam=load*C/S
    t=0.0; ev=[]; usage=0; held=[0,0,0]
    off=[0,0,0]; acc=[0,0,0]
    # rate estimates (EWMA of arrivals per class)
    rate=[lam*m for m in MIX]
    nxt=rng.expovariate(lam)
    while True:
        if ev and ev[0][0] < nxt:
            tt,c=heapq.heappop(ev); t=tt; usage-=1; held[c]-=1; continue
        t=nxt
        if t>T: break
        nxt=t+rng.expovariate(lam)
        u=rng.random(); c=0 if u<MIX[0] else (1 if u<MIX[0]+MIX[1] else 2)
        warm = t>100
        if warm: off[c]+=1
        if policy(c, usage, held, rate):
            usage+=1; held[c]+=1
            if warm: acc[c]+=1
            heapq.heappush(ev,(t+rng.expovariate(1/S),c))
    ref=[off[i]-acc[i] for i in range(3)]
    tot=sum(ref)
    return [acc[i]/off[i] for i in range(3)], [r/tot if tot else 0 for r in ref]
def strict(load):
    d=[load*C*m for m in MIX]; left=C; adm=[]
    for x in d: a=min(x,left); adm.append(a); left-=a
    ref=[d[i]-adm[i] for i in range(3)]; tot=sum(ref)
    return [adm[i]/d[i] for i in range(3)], [r/tot for r in ref]
def plain(c,u,h,r): return u<C
def static(fm,fl):
    lim=[C, int(C*fm), int(C*fl)]
    return lambda c,u,h,r: u<lim[c]
def trunk(rm,rl):
    res=[0,rm,rl]
    return lambda c,u,h,r: u < C-res[c]
def adaptive(z):
    # reserve for higher classes their expected in-flight not yet held, plus z*sqrt
    def p(c,u,h,r):
        if c==0: return u<C
        hi=sum(r[:c])*S; heldhi=sum(h[:c])
        reserve=max(0.0, hi + z*math.sqrt(hi) - heldhi)
        return u+1 <= C-reserve
    return p
def run_waiting(load, maxwait, reserve_z=None, T=3000, seed=1, maxq=10**9):
    rng=random.Random(seed); lam=load*C/S
    ev=[]  # (time, kind, data) kind 0=departure(class),1=expire(id)
    q=[[],[],[]]  # per class FIFO of (id, arrival)
    alive={}; usage=0; held=[0,0,0]; off=[0]*3; acc=[0]*3; waits=[[],[],[]]
    nxt=rng.expovariate(lam); t=0; nid=0
    rate=[lam*m for m in MIX]
    def gate(c):
        if reserve_z is None or c==0: return True
        hi=sum(rate[:c])*S; reserve=max(0.0,hi+reserve_z*math.sqrt(hi)-sum(held[:c]))
        return usage+1<=C-reserve
    def admit(c,arr,now):
        nonlocal usage
        usage+=1; held[c]+=1
        if arr>100: acc[c]+=1; waits[c].append(now-arr)
        heapq.heappush(ev,(now+rng.expovariate(1/S),0,c))
    def serve(now):
        while usage<C:
            for c in range(3):
                while q[c] and q[c][0][0] not in alive: q[c].pop(0)
                if q[c] and gate(c):
                    i,arr=q[c].pop(0); del alive[i]; admit(c,arr,now); break
            else: return
    while True:
        if ev and ev[0][0]<nxt:
            tt,k,d=heapq.heappop(ev); t=tt
            if k==0: usage-=1; held[d]-=1; serve(t)
            else: alive.pop(d,None)
            continue
        t=nxt
        if t>T: break
        nxt=t+rng.expovariate(lam)
        u=rng.random(); c=0 if u<MIX[0] else (1 if u<MIX[0]+MIX[1] else 2)
        if t>100: off[c]+=1
        if usage<C and gate(c) and not any(q[k] for k in range(c+1)): admit(c,t,t)
        elif maxwait>0 and len(alive)<maxq:
            nid+=1; alive[nid]=1; q[c].append((nid,t)); heapq.heappush(ev,(t+maxwait,1,nid))
    ref=[off[i]-acc[i] for i in range(3)]; tot=sum(ref)
    p99=[sorted(w)[int(len(w)*.99)] if w else float('nan') for w in waits]
    return [acc[i]/off[i] for i in range(3)],[r/tot for r in ref],p99

def fail_fast_table():
    print('== fail fast')
    for load in [1.5,2,4]:
        sg,sr=strict(load)
        print(f"load {load}: strict goodput {['%.3f'%x for x in sg]} refusal shares {['%.3f'%x for x in sr]}")
        for name,pol in [("plain",plain),("static .9/.8",static(.9,.8)),("static .75/.5",static(.75,.5)),("trunk 2/4",trunk(2,4)),("trunk 4/8",trunk(4,8)),("adaptive z=1",adaptive(1)),("adaptive z=2",adaptive(2)),("adaptive z=3",adaptive(3))]:
            g,r=run(load,pol)
            print(f"   {name:14s} goodput {['%.3f'%x for x in g]} refusal shares {['%.3f'%x for x in r]}")

def waiting_table():
    print('== a bounded wait, class-ordered room')
    for load in [1.5,2,4]:
        for mw in [0.5,2.0]:
            for z in [None,2]:
                g,r,p=run_waiting(load,mw,z)
                print(f"load {load} maxwait {mw}S reserve z={z}: goodput {['%.3f'%x for x in g]} shares {['%.3f'%x for x in r]} p99 wait {['%.3f'%x for x in p]}")

if __name__ == '__main__':
    fail_fast_table()
    waiting_table()
