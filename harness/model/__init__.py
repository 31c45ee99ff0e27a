"""Pydantic models and units only: profile, counters, suite and task, grade verdict, attempt
record, run and its identity, report, errors. Imports nothing of the runtime; the JSON
Schemas in ``schemas/`` are exported from here (``python -m harness.model.schemas``).

Every model is built with ``defer_build``: its validator is made when it is first used, so a
command builds only the models it uses (a report: 0.07 s less start-up)."""
