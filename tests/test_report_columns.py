"""The report's columnar path gives what the plain definitions give.

A report of 10^5 attempts groups them by slot in column passes (core.aggregate.slot_index)
over an AttemptTable that a store's lean read fills column by column, with the values most
rows share sent back by SQLite as small integers. Checked here on seeded random runs with
every shape a slot can have (several clean attempts, discards before and after a refill,
attempts of no slot, records not stored yet): the outcomes against a per-slot definition
written out plainly, and the report from whole records against the report from a real
SQLite store's lean read.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest

from harness.core.aggregate import outcomes, slot_index, slot_views, task_outcomes
from harness.core.outcome import slot_status
from harness.model.attempt import AttemptRecord
from harness.model.outcomes import TaskOutcomes
from harness.model.report import Report
from harness.model.run import RunRecord
from harness.model.table import AttemptTable
from harness.report.build import build_report
from harness.store.store import REPORT_FIELDS, Store

REASONS = ["host_cpu_contention", "interrupted", "controller_lost", "upstream_rate_limited", "engine_error"]
KINDS = ["wrong_state", "crashed", "timeout", "oom_killed", "ungradable", None]
NODES = [{}, {"hostname": "a", "kernel": "6.1", "logical_cpus": 2, "cgroup_version": "2"},
         {"hostname": "b", "kernel": "6.2", "logical_cpus": 4, "cgroup_version": "2"}]


def random_run(rng: random.Random, i: int, stored_ids: bool = True) -> tuple[RunRecord, list[AttemptRecord]]:
    tasks = [f"t{j}" for j in range(rng.randint(1, 6))]
    trials = rng.randint(1, 5)
    refills: dict[str, int] = {}
    atts: list[AttemptRecord] = []
    gateway = rng.random() < 0.25

    def add(task: str, slot: int, no: int, clean: bool) -> None:
        outcome = rng.choice(["pass", "fail", None]) if clean else rng.choice([None, "fail"])
        kw = dict(id=len(atts) + 1 if stored_ids else None, run_id=f"r{i}", task_id=task, slot=slot, attempt_no=no, seed=slot,
                  verdict="clean" if clean else "discarded", outcome=outcome,
                  failure_kind=rng.choice(KINDS) if outcome == "fail" else None,
                  grade_reason=rng.choice([None, "log: expected x", "y" * 400]),
                  error=rng.choice([None, None, "boom", "the envelope is too small for the task"]),
                  reasons=[] if clean else rng.sample(REASONS, rng.randint(0, 2)),
                  rules=[] if clean else rng.choice([[], [{"rule": "host_cpu_contention", "scope": "host", "breached": True, "detail": "d"}]]),
                  wall_s=round(rng.random() * 3, 4), agent_wall_s=rng.choice([None, round(rng.random(), 3)]), node=rng.choice(NODES))
        if gateway and rng.random() < 0.7:
            kw["upstream"] = {"calls": 1, "input_tokens": rng.randint(0, 100), "output_tokens": rng.randint(0, 50), "wait_s": 0.1,
                              "models": ["m1"], "retries": rng.randint(0, 2)}
            kw["model_calls"] = [{"provider": "openai", "model": "m1", "started": 1.0, "status": 200}]
        atts.append(AttemptRecord(**kw))

    for task in tasks:
        for slot in range(trials):
            n = rng.choice([0, 1, 1, 1, 2, 3, 4])
            for no in range(1, n + 1):
                add(task, slot, no, rng.random() < 0.6)
            if n and rng.random() < 0.05:
                refills[f"{task}/{slot}"] = rng.randint(1, n)
    if rng.random() < 0.2:
        add("stray", 0, 1, True)  # a task the run does not have
    if rng.random() < 0.2:
        add(tasks[0], trials + 1, 1, True)  # a slot past its trials
    if rng.random() < 0.3:
        rng.shuffle(atts)  # whatever order they arrive in
    run = RunRecord(id=f"r{i}", created_at=dt.datetime(2024, 1, 1), status="complete", suite="s", suite_hash="h", image="img",
                    image_digest="d", agent_cmd=["a"], profile="standard", profile_json={"name": "standard"}, harness_version="0",
                    host={}, cgroup_version="2", trials=trials, ks=sorted({1, rng.randint(1, trials)}), max_reruns=rng.choice([0, 1, 3]),
                    task_ids=tasks, refills=refills)
    return run, atts


def plain_outcomes(run: RunRecord, attempts: list[AttemptRecord]) -> list[TaskOutcomes]:
    """The definition, one slot at a time: the first clean attempt by (attempt number, id)
    counts (equal keys: the first given); no clean one: pending, or unmeasured once the
    discards charged since the slot's refill exceed the rerun budget."""
    out = []
    for task in dict.fromkeys(run.task_ids):
        trials, slots, kinds = [], [], {}
        for i in range(run.trials):
            mine = [a for a in attempts if a.task_id == task and a.slot == i]
            clean = sorted((a for a in mine if a.verdict == "clean"), key=lambda a: (a.attempt_no, a.id or 0))
            if clean:
                passed = clean[0].outcome == "pass"
                trials.append(passed)
                slots.append("pass" if passed else "fail")
                if not passed:
                    k = clean[0].failure_kind or "unknown"
                    kinds[k] = kinds.get(k, 0) + 1
            else:
                disc = [a for a in mine if a.verdict != "clean"]
                slots.append(slot_status(None, disc, run.max_reruns, run.refills.get(f"{task}/{i}", 0)))
        out.append(TaskOutcomes(task_id=task, trials=trials, slots=slots, failure_kinds=kinds))
    return out


@pytest.mark.parametrize("stored_ids", [True, False])
def test_outcomes_by_column_are_the_plain_definition(stored_ids):
    rng = random.Random(20261207 + stored_ids)
    for i in range(300):
        run, atts = random_run(rng, i, stored_ids)
        got = task_outcomes(run, atts)
        want = plain_outcomes(run, atts)
        assert got == want, (i, run.task_ids)
        assert [(t.n, t.c) for t in got] == [(len(t.trials), sum(t.trials)) for t in want]
        # the slot views read the same index: each slot's clean attempt and its discarded ones
        views = slot_views(atts, list(run.task_ids), run.trials, run.max_reruns, run.refills)
        for t in want:
            assert [v.status for v in views[t.task_id]] == t.slots
            for v in views[t.task_id]:
                disc = [a for a in atts if a.task_id == t.task_id and a.slot == v.slot and a.verdict != "clean"]
                assert v.discarded == sorted(disc, key=lambda a: (a.attempt_no, a.id or 0))


def test_the_slot_index_names_every_attempt_of_no_slot_and_every_discard():
    rng = random.Random(5)
    for i in range(100):
        run, atts = random_run(rng, i)
        ix = slot_index(atts, list(run.task_ids), run.trials)
        assert ix.strays == [r for r, a in enumerate(atts) if a.task_id not in run.task_ids or a.slot >= run.trials]
        assert ix.thrown == [r for r, a in enumerate(atts) if a.verdict != "clean"]
        placed = sorted(r for rows in ix.discarded.values() for r in rows) + [r for r in ix.clean if r >= 0]
        assert len(placed) == len(set(placed))  # no attempt counted twice
        # every attempt is placed, a stray, or a clean one after the one its slot counts
        assert sorted(placed + ix.strays + ix.extra_clean) == list(range(len(atts)))
        rep = build_report(run, atts)
        assert any("came after the one that counts" in w for w in rep.warnings) == bool(ix.extra_clean)


def _store_of(tmp_path, run: RunRecord, atts: list[AttemptRecord]) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / (run.id + '.db')}")
    store.add_run(run)
    for a in atts:
        store.add_attempt(a.model_copy(update={"id": None}))
    return store


def test_a_report_from_the_stores_lean_read_is_the_report_from_whole_records(tmp_path):
    rng = random.Random(99)
    for i in range(40):
        run, atts = random_run(rng, i)
        store = _store_of(tmp_path, run, atts)
        whole = store.attempts(run.id)  # stored in the order given: ids are 1, 2, ... again
        lean = store.attempts(run.id, REPORT_FIELDS)
        assert isinstance(lean, AttemptTable) and len(lean) == len(whole)
        prices = {"m1": {"input": 1.0, "output": 2.0, "cached": 0.5}} if i % 2 else None
        a = build_report(run, whole, prices=prices).model_dump(mode="json", by_alias=True)
        b = build_report(run, lean, prices=prices).model_dump(mode="json", by_alias=True)
        assert a == b, i
        # every row is what a Report validates (the build sets the rows in unvalidated)
        assert Report.model_validate(build_report(run, lean, prices=prices).data()).data() == a
        # the values SQLite sent back as codes are the values stored
        for name in ("verdict", "outcome", "failure_kind", "node", "reasons", "upstream", "model_calls"):
            assert lean.col(name) == [getattr(x, name) for x in whole], name
        store.engine.dispose()


def test_an_attempt_table_reads_like_its_records():
    recs = [AttemptRecord(id=i, run_id="r", task_id="t", slot=i, attempt_no=1, seed=0, verdict="clean", outcome="pass")
            for i in range(3)]
    t = AttemptTable.of(recs)
    assert AttemptTable.of(t) is t
    assert list(t) == recs and t[1] is recs[1] and t[-1] is recs[2] and len(t) == 3
    assert t.col("slot") == [0, 1, 2] and t.rows([2, 0]) == [recs[2], recs[0]]
    make = tuple  # a lean record: the row's values in the table's field order
    lean = AttemptTable({"id": [7, 8], "slot": [0, 1]}, make)
    assert lean[1] == (8, 1) and lean[-2] == (7, 0) and lean[0:2] == [(7, 0), (8, 1)] and list(lean) == [(7, 0), (8, 1)]
    with pytest.raises(IndexError):
        lean[2]
    with pytest.raises(AttributeError, match="'verdict'.*not read"):
        lean.col("verdict")
    with pytest.raises(ValueError, match="different lengths"):
        AttemptTable({"id": [1], "slot": []}, make)


def test_task_outcomes_made_unvalidated_are_the_validated_ones():
    made = TaskOutcomes.made("x", [True, False, True], ["pass", "fail", "pass", "pending"], {"wrong_state": 1})
    valid = TaskOutcomes(task_id="x", trials=[True, False, True], slots=["pass", "fail", "pass", "pending"],
                         failure_kinds={"wrong_state": 1})
    assert made == valid and made.model_dump() == valid.model_dump() and repr(made) == repr(valid)
    assert (made.n, made.c) == (3, 2) and made.model_fields_set == valid.model_fields_set
    copy = made.model_copy(update={"trials": [False]})
    assert (copy.n, copy.c) == (1, 0) and (made.n, made.c) == (3, 2)
