"""``make bench``: ratios measured side by side in one run, each against its own baseline.

Never an absolute time as a pass/fail: every figure is printed next to the baseline it is
compared with, both measured here and now, interleaved so drift hits both equally.

  1. per-attempt overhead: harness ``run_command`` (sandbox exec of a no-op) vs a bare
     docker-py ``containers.run`` of the same image under the same envelope;
  2. sampling cost: controller CPU spent by the monitor per attempt-second, as a share of one core;
  3. estimator: suite metrics for many tasks x trials vs a plain Python loop over the same data.

Usage: python -m harness.bench [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from harness.images import SANDBOX_IMAGE
from harness.profile import load_profile
from harness.sandbox import LABEL, Monitor, Sandbox, connect, run_command
from harness.scheduler import CpuPool


def _bare_run(client, prof, cpuset) -> None:
    client.containers.run(
        SANDBOX_IMAGE,
        ["true"],
        remove=True,
        cpu_period=prof.cpu_period_us,
        cpu_quota=prof.quota_us,
        cpuset_cpus=",".join(map(str, cpuset)),
        mem_limit=prof.memory,
        memswap_limit=prof.memory,
        pids_limit=prof.pids,
        read_only=True,
        tmpfs={p: f"size={s}" for p, s in prof.tmpfs.items()},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network_mode="none",
        user=prof.user,
        labels={LABEL: "1", "dev.harness.bench": "bare"},
    )


def bench_overhead(client, rounds: int) -> dict:
    prof = load_profile("standard")
    cpuset = CpuPool.for_host().lease(1)
    harness_t, bare_t = [], []
    # warm both paths once (image layers in page cache, SDK connection pool)
    _bare_run(client, prof, cpuset)
    run_command(client, SANDBOX_IMAGE, prof, cpuset, ["true"])
    for i in range(rounds):
        order = [("bare", _bare_run), ("harness", None)] if i % 2 == 0 else [("harness", None), ("bare", _bare_run)]
        for name, fn in order:
            t0 = time.perf_counter()
            if name == "bare":
                _bare_run(client, prof, cpuset)
                bare_t.append(time.perf_counter() - t0)
            else:
                r = run_command(client, SANDBOX_IMAGE, prof, cpuset, ["true"])
                assert r.kind == "ok", r.error
                harness_t.append(time.perf_counter() - t0)
    hm, bm = statistics.median(harness_t), statistics.median(bare_t)
    return {
        "name": "per-attempt overhead, no-op command",
        "harness_median_s": round(hm, 4),
        "baseline_median_s": round(bm, 4),
        "baseline": "docker-py containers.run(remove=True), same image and envelope",
        "ratio": round(hm / bm, 3),
        "rounds": rounds,
    }


def bench_sampling(client, seconds: float = 5.0, hz: float = 5.0) -> dict:
    prof = load_profile("standard")
    cpuset = CpuPool.for_host().lease(1)
    from harness import hoststats

    with Sandbox(client, SANDBOX_IMAGE, prof, cpuset) as sb:
        cg0 = sb.snapshot()
        host0 = hoststats.read_host_snapshot(time.monotonic())
        # baseline: the same process idling for the same time without a monitor
        c0 = time.process_time()
        time.sleep(seconds)
        idle_cpu = time.process_time() - c0
        mon = Monitor(sb._reader.read, cpuset, hz)
        c0 = time.process_time()
        mon.start(time.monotonic(), host0, cg0)
        time.sleep(seconds)
        mon.stop()
        mon_cpu = time.process_time() - c0
    per_sample_us = (mon_cpu - idle_cpu) / max(1, len(mon.samples)) * 1e6
    share = (mon_cpu - idle_cpu) / seconds
    return {
        "name": f"sampling cost at {hz:g} Hz",
        "samples": len(mon.samples),
        "controller_cpu_per_attempt_second": round(share, 5),
        "share_of_one_core_pct": round(100 * share, 3),
        "per_sample_us": round(per_sample_us, 1),
        "baseline": "same process idling without a monitor, same duration",
    }


def bench_estimator(tasks: int = 20_000, trials: int = 100) -> dict:
    from harness.estimator import TaskOutcomes, suite_metrics

    rng = random.Random(0)
    data = []
    for i in range(tasks):
        p = rng.random()
        data.append(TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(trials)]))
    t0 = time.perf_counter()
    suite_metrics(data, [1, 4, 8])
    est = time.perf_counter() - t0
    # baseline: one pass over the same booleans computing the plain mean
    t0 = time.perf_counter()
    s = 0
    for t in data:
        s += sum(t.trials)
    base = time.perf_counter() - t0
    return {
        "name": f"estimator, {tasks} tasks x {trials} trials, k in 1,4,8",
        "estimator_s": round(est, 4),
        "baseline_s": round(base, 4),
        "baseline": "a plain Python sum over the same outcomes",
        "ratio": round(est / base, 2),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="harness.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "15")))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    client = connect()
    results = [bench_overhead(client, args.rounds), bench_sampling(client), bench_estimator()]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"== {r.pop('name')}")
        for k, v in r.items():
            print(f"   {k:38} {v}")


if __name__ == "__main__":
    main()
