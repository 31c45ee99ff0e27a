"""Pydantic models and units only: profile, counters, suite and task, grade verdict, attempt
record, run and its identity, report, errors. Imports nothing of the runtime; the JSON
Schemas in ``schemas/`` are exported from here (``python -m harness.model.schemas``)."""
