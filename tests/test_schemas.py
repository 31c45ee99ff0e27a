"""The JSON Schemas in schemas/ are exported from the pydantic models and must not be stale."""

from __future__ import annotations

import json

from harness.model.schemas import models, render, schema_dir


def test_schemas_are_up_to_date():
    stale = []
    for stem, model in models().items():
        f = schema_dir() / f"{stem}.schema.json"
        if not f.exists() or f.read_text() != render(model):
            stale.append(f.name)
    assert not stale, f"stale schemas {stale}: run `make schemas` and commit schemas/"


def test_no_unexpected_schema_files():
    expected = {f"{s}.schema.json" for s in models()}
    present = {p.name for p in schema_dir().glob("*.json")}
    assert present == expected


def test_profile_schema_documents_every_field():
    s = json.loads(render(models()["profile"]))
    missing = [k for k, v in s["properties"].items() if "description" not in v and "$ref" not in v and "allOf" not in v]
    assert not missing, missing
