"""CLI command that sends a stored run elsewhere: export (OpenTelemetry traces over OTLP/HTTP).

Thin: check the endpoint and headers, open the store read-only, hand the run and its
attempts to ``harness.engine.otel``, print one line.
"""

from __future__ import annotations

from typing import Optional

import typer

from harness.cli.app import DB_HELP, err

OTLP_HELP = ("OTLP/HTTP endpoint of an OpenTelemetry collector: its base (http://localhost:4318) or its full "
             ".../v1/traces URL. Needs `pip install 'harness\\[otel]'`.")
OTLP_HEADER_HELP = ("KEY=VALUE sent with every OTLP request, e.g. authorization=... (repeatable; values are never printed). "
                    "$OTEL_EXPORTER_OTLP_HEADERS is read too, and keeps a credential off the command line.")


def export(
    run: str = typer.Argument("last", help="Run id, a unique prefix of it, or `last`."),
    otlp: str = typer.Option(..., "--otlp", help=OTLP_HELP),
    otlp_header: list[str] = typer.Option([], "--otlp-header", help=OTLP_HEADER_HELP),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Send a stored run to an OpenTelemetry collector as one trace.

    OTLP over HTTP, protobuf.

    Spans: the run (its identity) > one per slot (task x trial) > one per
    attempt, discarded ones too (envelope asked and read back, cgroup and
    host counters, SLA rules, verdict, outcome; the grade as a
    `gen_ai.evaluation.result` event) > its phases at their recorded times
    (those it had of gateway, lane, services, sandbox, setup, agent, stop,
    export, grade, verifier-sandbox, halt, remove) >
    under the agent, one `chat {model}` span per model call the gateway
    recorded (GenAI attributes: provider, model, tokens, error.type). Times
    are the recorded ones and ids derive from the run, so this sends the
    same trace `harness run --otlp` sent live. Returns once all is sent.
    A run still in progress is sent as it stands, with a note: export it
    again after it ends (same ids, final end times).

    Examples:

      harness export last --otlp http://localhost:4318

      harness export r20261129-2154 --otlp https://otel.example.com/v1/traces

      OTEL_EXPORTER_OTLP_HEADERS='authorization=Bearer ...' harness export last --otlp https://otel.example.com

    $OTEL_EXPORTER_OTLP_TIMEOUT: milliseconds one request may take (default 10000).

    Exit codes: 0 sent, 2 usage error (bad URL or header, unknown run,
    the otel extra missing), 3 the collector did not take the spans
    (down, wrong port, refused).
    """
    from harness.engine import otel
    from harness.store.store import Store

    endpoint, headers = otel.otlp_options(otlp, otlp_header)
    store = Store.open(db, mode="ro")
    row = store.get_run(run)
    if row.status == "running":  # ids derive from the run: the export after it ends sends these spans again
        err.print(f"note: run {row.id} is still running; its run and slot spans are sent as they stand now and again, "
                  "with the same ids and later end times, when you export it after it ends (a collector may keep both)",
                  highlight=False)
    n = otel.export_run(row, store.attempts(row.id), endpoint, headers)
    err.print(f"exported {n} spans of run {row.id} (status {row.status}) to {otel.shown_url(endpoint)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(export)
