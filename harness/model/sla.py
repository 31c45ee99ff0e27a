"""The SLA judge's verdict on one attempt: every rule as data."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Scope = Literal["host", "envelope", "upstream"]


class RuleResult(BaseModel):
    """One SLA rule evaluated on one attempt."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    rule: str = Field(..., description="Rule name, e.g. host_cpu_contention.")
    scope: Scope = Field(..., description="host: the node broke its promise; envelope: the envelope starved the task; "
                        "upstream: the model API failed the agent.")
    value: float | None = Field(None, description="Measured value (None = not measurable on this host).")
    threshold: float | None = Field(None, description="Limit from the profile's [sla] table.")
    breached: bool = Field(..., description="True when the value crossed the threshold.")
    detail: str = Field("", description="One line for humans: measured vs threshold.")

    def line(self) -> str:
        return f"{self.rule}: {self.detail}" if self.detail else self.rule


class Judgement(BaseModel):
    """The verdict on one attempt."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    verdict: Literal["clean", "discarded"] = Field(..., description="clean attempts reach the estimator; discarded ones are kept as evidence.")
    rules: list[RuleResult] = Field(default_factory=list, description="Every rule evaluated, breached or not.")

    @property
    def breaches(self) -> list[RuleResult]:
        return [r for r in self.rules if r.breached]

    @property
    def reasons(self) -> list[str]:
        return [r.rule for r in self.breaches]

    @property
    def only_envelope(self) -> bool:
        b = self.breaches
        return bool(b) and all(r.scope == "envelope" for r in b)
