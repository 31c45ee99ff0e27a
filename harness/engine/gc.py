"""``harness gc``: free disk, keep evidence.

Removes the artifact folders of old runs; rows stay unless ``purge``. Never touches a run
still being run, and keeps the artifacts of resumable (interrupted) runs unless asked.
Runs marked running whose controller is gone (killed, out of memory, its machine down) are
marked ``interrupted`` first, so they become resumable and show as what they are.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

from harness.engine.runner import controller_gone
from harness.model.units import utcnow
from harness.store.store import Store


def _dir_stats(path: Path) -> tuple[int, int]:
    """(bytes, files) under path, not following symlinks."""
    total = files = 0
    for root, _dirs, names in os.walk(path, followlinks=False):
        for n in names:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
                files += 1
            except OSError:
                pass
    return total, files


def recover_dead_runs(store: Store, dry_run: bool = False) -> list[str]:
    """Mark runs whose controller is gone ``interrupted`` (resumable); their ids."""
    out = []
    for r in store.runs_with_status("running"):
        if controller_gone(r):
            out.append(r.id)
            if not dry_run:
                store.set_run_status(r.id, "interrupted")
    return out


def collect(store: Store, age: dt.timedelta, purge: bool = False, dry_run: bool = False,
            include_interrupted: bool = False) -> dict[str, Any]:
    """Collect runs created more than ``age`` ago; returns what was (or would be) done."""
    recovered = recover_dead_runs(store, dry_run=dry_run)
    cutoff = utcnow() - age
    old = store.runs_before(cutoff)
    status = {r.id: ("interrupted" if r.id in recovered else r.status) for r in old}
    running = [r for r in old if status[r.id] == "running"]
    kept = [r for r in old if status[r.id] == "interrupted" and not include_interrupted]
    targets = [r for r in old if status[r.id] != "running" and r not in kept]
    counts = store.counts([r.id for r in targets]) if purge and targets else {}
    report: list[dict[str, Any]] = []
    problems: list[str] = []
    for r in targets:
        folder = Path(r.artifacts_dir) if r.artifacts_dir else None
        entry: dict[str, Any] = {
            "run_id": r.id, "created_at": r.created_at.isoformat(timespec="seconds") if r.created_at else None,
            "status": status[r.id], "folder": str(folder) if folder else None, "folder_exists": False,
            "bytes": 0, "files": 0, "removed": False,
        }
        if purge:
            entry["attempts"], entry["samples"] = counts.get(r.id, (0, 0))
        if folder is not None and folder.is_dir() and not folder.is_symlink():
            if folder.name != r.id:  # never remove a folder that is not plainly this run's
                problems.append(f"run {r.id}: artifacts folder {folder} is not named after the run; left alone, remove it by hand")
            else:
                entry["folder_exists"] = True
                entry["bytes"], entry["files"] = _dir_stats(folder)
                if not dry_run:
                    try:
                        shutil.rmtree(folder)
                        entry["removed"] = True
                    except OSError as e:
                        problems.append(f"run {r.id}: cannot remove {folder}: {e.strerror or e}; check its permissions")
        if entry["folder_exists"] or purge:
            report.append(entry)
    if purge and targets and not dry_run:
        deleted = store.purge_runs([r.id for r in targets])
    elif purge:
        deleted = {"runs": len(targets), "attempts": sum(e.get("attempts", 0) for e in report),
                   "samples": sum(e.get("samples", 0) for e in report)}
    else:
        deleted = {"runs": 0, "attempts": 0, "samples": 0}
    return _result(cutoff, dry_run, purge, report, deleted, [r.id for r in running], [r.id for r in kept], recovered, problems)


def nothing_stored(age: dt.timedelta, purge: bool = False, dry_run: bool = False) -> dict[str, Any]:
    """What :func:`collect` returns where no database exists yet: nothing to collect."""
    return _result(utcnow() - age, dry_run, purge, [], {"runs": 0, "attempts": 0, "samples": 0}, [], [], [], [])


def _result(cutoff: dt.datetime, dry_run: bool, purge: bool, report: list[dict[str, Any]], deleted: dict[str, int],
            running: list[str], kept: list[str], recovered: list[str], problems: list[str]) -> dict[str, Any]:
    return {
        "cutoff": cutoff.isoformat(timespec="seconds"), "dry_run": dry_run, "purge": purge,
        "runs": report, "freed_bytes": sum(e["bytes"] for e in report if e["folder_exists"]),
        "folders": sum(1 for e in report if e["folder_exists"]), "rows_deleted": deleted,
        "skipped_running": running, "kept_interrupted": kept, "recovered": recovered, "problems": problems,
    }
