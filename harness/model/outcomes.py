"""Per-task outcomes of a run: the one type the estimator, reports, gates and sweeps share.

Built from stored attempts by ``harness.core.aggregate``: only the clean attempt of each
slot counts, in trial order; an unmeasured slot is listed, never scored.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictBool

SlotStatus = Literal["pass", "fail", "unmeasured", "pending"]
MARKS = {"pass": "✓", "fail": "✗", "unmeasured": "·", "pending": "?"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class TaskOutcomes(_Model):
    """The clean outcomes of one task in one run, in trial (slot) order."""

    task_id: str = Field(min_length=1, description="Task id within the suite.")
    trials: list[StrictBool] = Field(
        default_factory=list,
        description="Outcome of the clean attempt of each measured slot, in trial-index order: "
        "true = pass, false = fail. Unmeasured slots and discarded attempts are not included; "
        "an empty list means the task is unmeasured.",
    )

    slots: list[SlotStatus] = Field(
        default_factory=list,
        description="Status of every slot in trial order (pass, fail, unmeasured: rerun budget spent without a "
        "clean attempt, pending: not finished); empty when only the clean outcomes are known.",
    )
    failure_kinds: dict[str, int] = Field(default_factory=dict, description="Failure kind -> clean failing trials.")

    # n and c are read for every task by every estimator (10^5 tasks, a dozen figures): computed
    # once per object. The model is frozen, so they cannot go stale; a copy with an update
    # computes them again (model_copy below).
    @cached_property
    def n(self) -> int:
        """Number of clean trials."""
        return len(self.trials)

    @cached_property
    def c(self) -> int:
        """Number of passing clean trials."""
        return sum(self.trials)

    @classmethod
    def made(cls, task_id: str, trials: list[bool], slots: list[SlotStatus], failure_kinds: dict[str, int]) -> "TaskOutcomes":
        """From values harness made itself (the slot index's outcomes: bools, slot statuses,
        counts), unvalidated, with n and c already counted: what ``model_construct`` makes,
        in a fifth of its time (10^4 tasks per large report)."""
        m = cls.__new__(cls)
        object.__setattr__(m, "__dict__", {"task_id": task_id, "trials": trials, "slots": slots, "failure_kinds": failure_kinds,
                                           "n": len(trials), "c": trials.count(True)})  # n, c: what the cached properties keep
        object.__setattr__(m, "__pydantic_fields_set__", set(_FIELDS))
        object.__setattr__(m, "__pydantic_extra__", None)
        object.__setattr__(m, "__pydantic_private__", None)
        return m

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "TaskOutcomes":
        out = super().model_copy(update=update, deep=deep)
        out.__dict__.pop("n", None)
        out.__dict__.pop("c", None)
        return out

    def marks(self) -> str:
        """✓ pass, ✗ fail, · unmeasured, ? not run yet: one mark per slot in trial order."""
        return "".join(map(MARKS.__getitem__, self.slots))

    @property
    def unmeasured(self) -> list[int]:
        """Slots whose rerun budget was spent without a clean attempt."""
        return [i for i, s in enumerate(self.slots) if s == "unmeasured"]

    @property
    def pending(self) -> list[int]:
        """Slots not finished (never run, or cut short by an interruption)."""
        return [i for i, s in enumerate(self.slots) if s == "pending"]


_FIELDS = frozenset(TaskOutcomes.model_fields)
