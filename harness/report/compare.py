"""Paired comparison of two runs on their common tasks (deltas B − A), as JSON-ready data."""

from __future__ import annotations

from typing import Any, Iterable

from harness.core.aggregate import task_outcomes
from harness.core.envelope import envelope_differences
from harness.core.paired import aa_floor, compare_runs
from harness.model.attempt import AttemptRecord
from harness.model.run import RunRecord
from harness.report.build import identity_data, run_ks

COMPARISON_SCHEMA = "harness.comparison/1"


def identity_differences(a: RunRecord, b: RunRecord, attempts_a: Iterable[AttemptRecord] = (),
                         attempts_b: Iterable[AttemptRecord] = ()) -> tuple[list[str], list[str]]:
    """(blocking, warnings) of run B against run A (see RunIdentity.differences); with the
    attempts, a run whose scored attempts ran on machines that differ in what a trial
    measures blocks too (it mixes environments inside itself)."""
    blocking, warns = a.identity.differences(b.identity)
    facts: dict[str, list[dict]] = {}
    for name, run, atts in (("A", a, attempts_a), ("B", b, attempts_b)):
        facts[name] = [x.node for x in atts if x.verdict == "clean" and x.node]
        differ = envelope_differences(facts[name])
        if differ:
            blocking.append(f"run {name} ({run.id}) ran on machines that differ: {'; '.join(differ)}")
    if not blocking and facts["A"] and facts["B"]:  # each run on one kind of machine, but not the same kind (read from the attempts)
        across = envelope_differences(facts["A"][:1] + facts["B"][:1])
        if across:
            warns.append(f"the runs ran on different kinds of machine (read from their attempts): {'; '.join(across)}")
    return blocking, warns


def aa_pairs(run_a: RunRecord, others: Iterable[tuple[RunRecord, list[AttemptRecord]]], attempts_a: list[AttemptRecord]) -> dict[str, Any] | None:
    """The empirical A/A floor: |Δ pass@1| between stored complete runs with run A's identity
    (nothing changed but the seed), over the same tasks and trials as A; None without a pair."""
    same = [(run_a, attempts_a)] + [(r, a) for r, a in others
                                    if r.id != run_a.id and r.status == "complete" and r.identity_hash == run_a.identity_hash
                                    and r.trials == run_a.trials and sorted(r.task_ids) == sorted(run_a.task_ids)]
    rates = []
    for r, atts in same[:12]:
        outs = [t for t in task_outcomes(r, atts) if t.n > 0]
        rates.append({t.task_id: t.c / t.n for t in outs})
    deltas = []
    for i in range(len(rates)):
        for j in range(i + 1, len(rates)):
            common = sorted(set(rates[i]) & set(rates[j]))
            if common:
                deltas.append(sum(rates[j][t] - rates[i][t] for t in common) / len(common))
    return aa_floor(deltas)


def build_comparison(run_a: RunRecord, attempts_a: Iterable[AttemptRecord], run_b: RunRecord, attempts_b: Iterable[AttemptRecord], *,
                     seed: int = 0, stored: Iterable[tuple[RunRecord, list[AttemptRecord]]] = ()) -> dict[str, Any]:
    """Paired comparison of run A (baseline) and run B (candidate), deltas B - A, as plain data.

    ``stored``: other runs (with their attempts) to look for A/A pairs in (see aa_pairs).
    Raises ValueError when the runs share no task measured in both.
    """
    attempts_a, attempts_b = list(attempts_a), list(attempts_b)
    oa, ob = task_outcomes(run_a, attempts_a), task_outcomes(run_b, attempts_b)
    ks = sorted(set(run_ks(run_a)) & set(run_ks(run_b))) or [1]
    cmp = compare_runs(oa, ob, ks, seed=seed)
    marks_a = {t.task_id: t.marks() for t in oa}
    marks_b = {t.task_id: t.marks() for t in ob}
    blocking, warns = identity_differences(run_a, run_b, attempts_a, attempts_b)
    if run_a.seed != run_b.seed:
        warns.append(f"seed differs: A {run_a.seed} vs B {run_b.seed} (the agent's seeds differ too; per-task deltas "
                     "include that change)")
    alpha = 1 - cmp.conf
    cannot = None
    if cmp.best_p > alpha:
        cannot = (f"no outcome of these {cmp.n_common} task(s) at these trial counts can be significant at {alpha:g}: even the "
                  f"most extreme one gives p ≥ {cmp.best_p:.2g} -- add tasks or trials before reading Δ")
    per_task = []
    for d in cmp.per_task:
        per_task.append(
            {
                "task": d.task_id,
                "marks_a": marks_a[d.task_id],
                "marks_b": marks_b[d.task_id],
                "n_a": d.n_a, "c_a": d.c_a, "n_b": d.n_b, "c_b": d.c_b,
                "pass1_a": d.pass1_a, "pass1_b": d.pass1_b, "delta_pass1": d.delta_pass1,
                "delta_pass_hat_k": {f"pass^{k}": v for k, v in d.delta_pass_hat_k.items() if k > 1},
            }
        )
    per_task.sort(key=lambda x: (x["delta_pass1"], x["task"]))
    suite = [
        {"metric": "pass@1" if s.k == 1 else f"pass{s.metric[4]}{s.k}", **s.model_dump(mode="json", exclude={"metric"})}
        for s in cmp.suite
    ]
    return {
        "schema": COMPARISON_SCHEMA,
        "a": {"run_id": run_a.id, **identity_data(run_a)},
        "b": {"run_id": run_b.id, **identity_data(run_b)},
        "ks": ks,
        "identity": {"blocking": blocking, "warnings": warns},
        "n_common": cmp.n_common,
        "only_in_a": cmp.only_in_a,
        "only_in_b": cmp.only_in_b,
        "unmeasured": cmp.unmeasured,
        "per_task": per_task,
        "suite": suite,
        "test": cmp.test.model_dump(mode="json"),
        "n_perm": cmp.n_perm,
        "seed": cmp.seed,
        "best_p": cmp.best_p,
        "cannot_be_significant": cannot,
        "aa_pairs": aa_pairs(run_a, stored, attempts_a),
    }
