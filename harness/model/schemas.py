"""JSON Schemas of the public models, exported into ``schemas/``.

``python -m harness.model.schemas`` (or ``make schemas``) rewrites them; a test fails when
the checked-in files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel


def models() -> dict[str, type[BaseModel]]:
    """File stem -> model, for every schema we publish."""
    from harness.model.attempt import AttemptRecord
    from harness.model.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta, Sample
    from harness.model.grade import Verdict
    from harness.model.profile import Profile
    from harness.model.report import Report
    from harness.model.run import RunRecord
    from harness.model.sandbox import AttemptResult
    from harness.model.sla import Judgement
    from harness.model.suite import SuiteSpec, Task

    return {
        "profile": Profile,
        "suite": SuiteSpec,
        "task": Task,
        "run": RunRecord,
        "attempt": AttemptRecord,
        "grade-verdict": Verdict,
        "report": Report,
        "sandbox-attempt": AttemptResult,
        "sla-judgement": Judgement,
        "counters": CounterDelta,
        "host-counters": HostDelta,
        "cgroup-snapshot": CgroupSnapshot,
        "cgroup-limits": CgroupLimits,
        "sample": Sample,
    }


def render(model: type[BaseModel]) -> str:
    schema = model.model_json_schema(mode="validation", by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schema_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "schemas"


def write(out: Path | None = None) -> list[Path]:
    out = out or schema_dir()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, model in models().items():
        p = out / f"{stem}.schema.json"
        p.write_text(render(model))
        written.append(p)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(p)
