"""The coverage and false-positive tables of docs/statistics.md, by seeded simulation.

    python tests/calibration_tables.py                          # this checkout ("after")
    PYTHONPATH=/path/to/older/checkout python tests/calibration_tables.py   # "before"

(An older checkout has `cluster_bootstrap` and the sign-flip `compare_runs` in the
estimator; this one `suite_interval` and `harness.core.paired`.) About 40 s on one core."""
import math, random, sys, time
from harness.model.outcomes import TaskOutcomes as T
import harness.core.estimator as est
MODELS=[(1,1),(0.5,0.5),(5,1),(2,5),(0.3,0.1),(8,2),(0.2,0.8)]
NEW = hasattr(est, "suite_interval")
def truth(a,b,metric,k):
    if metric=="pass@1": return a/(a+b)
    prod=math.prod(((b+j) if metric=="pass@k" else (a+j))/(a+b+j) for j in range(k))
    return 1-prod if metric=="pass@k" else prod
def interval(outs, metric, k):
    if NEW: return est.suite_interval(outs, metric, k)
    return est.cluster_bootstrap(outs, metric, None if metric=="pass@1" else k, n_boot=500, seed=1)
def cov(Tn, model, metric, k, reps, seed):
    rng=random.Random(seed); tv=truth(*model,metric,k); hit=0
    for _ in range(reps):
        outs=[T(task_id=f"t{i}", trials=[rng.random()<p for _ in range(8)]) for i,p in enumerate(rng.betavariate(*model) for _ in range(Tn))]
        iv=interval(outs,metric,k); hit+= iv.low<=tv<=iv.high
    return hit/reps
which = "after" if NEW else "before"
t0=time.time()
print(f"## coverage ({which}), 8 trials per task, 95% nominal, 300 replicates per cell, min-max over {len(MODELS)} Beta models")
print("| T | metric | min | max | per model |")
print("|---|---|---|---|---|")
for Tn in (8,16,50):
    for metric,k in (("pass@1",1),("pass@k",4),("pass^k",4)):
        c=[cov(Tn,m,metric,k,300,1000*Tn+i) for i,m in enumerate(MODELS)]
        name = "pass@1" if k==1 else metric.replace("k", str(k))
        print(f"| {Tn} | {name} | {min(c):.3f} | {max(c):.3f} | {' '.join(f'{x:.3f}' for x in c)} |", flush=True)
if NEW:
    from harness.core.paired import compare_runs
else:
    compare_runs = est.compare_runs
def fpr(Tn, na, nb, model, reps, seed):
    rng=random.Random(seed); rej=0; incons=0
    for r in range(reps):
        ps=[rng.betavariate(*model) for _ in range(Tn)]
        A=[T(task_id=f"t{i}", trials=[rng.random()<p for _ in range(na)]) for i,p in enumerate(ps)]
        B=[T(task_id=f"t{i}", trials=[rng.random()<p for _ in range(nb)]) for i,p in enumerate(ps)]
        c = compare_runs(A,B,[1],seed=r,n_perm=400) if NEW else compare_runs(A,B,[1],seed=r,n_boot=400,n_perm=400)
        p = c.suite[0].p_value if NEW else c.test.p_value
        rej += p <= 0.05
        excl = c.suite[0].low > 0 or c.suite[0].high < 0
        incons += excl != (p <= 0.05)
    return rej/reps, incons/reps
print(f"\n## paired test under the null ({which}), pass@1, alpha 0.05, 600 replicates per cell")
print("| T | trials A/B | model | rejection rate | interval disagrees with test |")
print("|---|---|---|---|---|")
for Tn in (8,16,50):
    for na,nb in ((8,8),(8,5)):
        for i,m in enumerate(MODELS[:4]):
            r,d = fpr(Tn,na,nb,m,600 if Tn<50 else 300,7*Tn+na+nb+i)
            print(f"| {Tn} | {na}/{nb} | Beta{m} | {r:.3f} | {d:.3f} |", flush=True)
print(f"\n({time.time()-t0:.0f} s)")
