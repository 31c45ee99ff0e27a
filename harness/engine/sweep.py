"""``harness sweep``: run one suite under several envelopes, linked by a sweep id.

Same tasks, same seeds under each envelope; every envelope is planned before any runs, so
one that cannot run here fails before anything is written. The comparison is
``harness.core.sweep``.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any, Callable

from harness.core.sweep import ProfileResult, profile_result
from harness.model.profile import Profile


def new_sweep_id() -> str:
    return dt.datetime.now().strftime("s%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def run_sweep(
    suite: str,
    profiles: list[tuple[Profile, str]],
    *,
    trials: int | None,
    tasks: list[str] | None,
    seed: int,
    db: str | None,
    concurrency: int | None = None,
    max_reruns: int | None = None,
    on_start: Callable[[Profile, Any], None] | None = None,
    events: Any = None,
    ks: list[int] | None = None,
    agent: dict[str, Any] | None = None,
) -> tuple[str, list[ProfileResult]]:
    """Run ``suite`` once per profile (same tasks, same seeds), linked by a sweep id."""
    from harness.engine.runner import RunOptions, Runner

    sweep_id = new_sweep_id()
    results = []
    planned = []
    # plan every envelope first, so one that cannot run here fails before any run starts
    for prof, note in profiles:
        opts = RunOptions(
            suite=suite,
            profile_obj=prof,
            trials=trials,
            tasks=tasks,
            seed=seed,
            concurrency=concurrency,
            max_reruns=max_reruns,
            sweep_id=sweep_id,
            ks=ks,
            note=f"sweep {sweep_id}: {prof.name}" + (f" ({note})" if note else ""),
            **(agent or {}),  # the same agent (and model gateway) under every envelope
        )
        planned.append((prof, note, Runner.plan(opts, db=db)))
    for prof, note, runner in planned:
        if on_start:
            on_start(prof, runner)
        runner.execute(events=events)
        results.append(profile_result(runner.store.get_run(runner.run.id), runner.store.attempts(runner.run.id), note))
    return sweep_id, results
