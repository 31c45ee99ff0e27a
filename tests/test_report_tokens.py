"""Model usage in every output: calls, tokens (spent vs scored), upstream errors and discards,
waiting time and cost under a price table; null (never 0) where usage was not reported; no
secret value anywhere; nothing new for a run without a gateway.

Runs and attempts are stored in a real SQLite store (no Docker) with the records the gateway
would have written (ModelCall dicts and their UpstreamSummary); the CLI is driven through
typer's CliRunner with --db.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.core.upstream import summarize
from harness.model.attempt import AttemptRecord
from harness.model.errors import UsageError
from harness.model.gateway import ModelCall
from harness.model.run import RunRecord
from harness.report.prices import parse_prices, prices_from_option
from harness.report.usage import discard_scopes
from harness.store.store import Store

T0 = dt.datetime(2024, 3, 1, 12, 0, 0)
PRICES = """
[models."gpt-4o-mini"]
input = 0.15
output = 0.60
cached = 0.075
"""
# values that must never reach an output: a key in the controller's environment, and
# credentials someone put in an upstream base URL
KEY_VALUE = "sk-live-THIS-IS-THE-KEY-0123456789"
URL_PASSWORD = "s3cr3t-pw"
URL_TOKEN = "sk-query-secret"

runner = CliRunner()


def cli(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def call(model: str | None = "gpt-4o-mini", t_in: int | None = None, t_out: int | None = None, cached: int | None = None,
         error: str | None = None, status: int = 200, at: float = 0.0, latency: float = 1.0, **kw) -> ModelCall:
    return ModelCall(provider="openai", endpoint="/v1/chat/completions", model=model, status=status, error=error,
                     started=1_700_000_000.0 + at, latency_s=latency, ttfb_s=latency / 2, tokens_in=t_in, tokens_out=t_out,
                     tokens_cached=cached, **kw)


def add(store: Store, run_id: str, task: str, slot: int, no: int, calls: list[ModelCall] | None, *, verdict: str = "clean",
        outcome: str | None = "pass", reasons: tuple[str, ...] = (), scope: str = "host", **kw) -> int:
    rules = [{"rule": r, "scope": scope, "value": 1, "threshold": 0, "breached": True, "detail": f"{r} 1 > 0"} for r in reasons]
    gw = {}
    if calls is not None:  # None: no gateway at all; []: a gateway and no call
        gw = {"model_calls": [c.model_dump(mode="json") for c in calls], "upstream": summarize(calls).model_dump(mode="json")}
    rec = AttemptRecord(
        run_id=run_id, task_id=task, slot=slot, attempt_no=no, seed=slot, verdict=verdict, reasons=list(reasons), rules=rules,
        outcome=outcome if verdict == "clean" else None, failure_kind="wrong_state" if outcome == "fail" else None,
        exit_code=0, wall_s=12.0, agent_wall_s=10.0, started_at=T0 + dt.timedelta(minutes=slot, seconds=no),
        finished_at=T0 + dt.timedelta(minutes=slot, seconds=no + 12), **gw, **kw,
    )
    return store.add_attempt(rec)


def run_record(run_id: str, tasks: list[str], **kw) -> RunRecord:
    return RunRecord(id=run_id, created_at=T0, status="complete", suite="refunds", suite_hash="sha-suite", image="harness/refunds",
                     profile="standard", profile_json={"name": "standard", "cpus": 1.0}, harness_version="0.1.0",
                     host={"hostname": "h1"}, cgroup_version="2", trials=2, ks=[1, 2], max_reruns=3, task_ids=tasks, **kw)


@pytest.fixture()
def gw(tmp_path, monkeypatch):
    """A gateway run: `priced` spends 3600 tokens in (3500 in its scored attempts) on a priced
    model, one attempt discarded for a 429; `silent`'s provider never reports usage; `foreign`
    calls a model with no price (60 calls in one attempt). Plus a price table file."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY_VALUE)
    monkeypatch.delenv("HARNESS_PRICES", raising=False)
    url = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(url)
    store.add_run(run_record(
        "run-gw", ["priced", "silent", "foreign"], agent_name="llm", secrets=["OPENAI_API_KEY"],
        upstreams={"openai": f"https://proxyuser:{URL_PASSWORD}@llm.internal/v1?api-key={URL_TOKEN}"},
    ))
    ids = {}
    # priced, slot 0: a 429 then a call (discarded, upstream), then a clean pass with two calls
    ids["discarded"] = add(store, "run-gw", "priced", 0, 1, [call(error="rate_limited", status=429, latency=0.2, detail="429 Too Many Requests"),
                                                            call(t_in=100, t_out=20, at=1)],
                           verdict="discarded", reasons=("upstream_rate_limited",), scope="upstream")
    ids["clean"] = add(store, "run-gw", "priced", 0, 2, [call(t_in=1000, t_out=200, cached=400, latency=3.0),
                                                        call(t_in=500, t_out=50, at=4, latency=1.5)],
                       egress=[{"at": 1.0, "method": "CONNECT", "host": "pypi.org", "port": 443, "allowed": False, "reason": "not in the allowlist"},
                               {"at": 2.0, "method": "CONNECT", "host": "api.github.com", "port": 443, "allowed": True,
                                "rule": "api.github.com:443", "bytes_up": 300, "bytes_down": 4096}],
                       egress_summary={"allowed": 1, "refused": 1, "dropped": 0})
    add(store, "run-gw", "priced", 1, 1, [call(t_in=2000, t_out=100)], outcome="fail")
    # silent: the provider reports no usage; one attempt discarded by the host, with a gateway and no call
    ids["silent"] = add(store, "run-gw", "silent", 0, 1, [call(), call(at=2)])
    add(store, "run-gw", "silent", 1, 1, [], verdict="discarded", reasons=("host_cpu_contention",))
    add(store, "run-gw", "silent", 1, 2, [call()])
    # foreign: a model the price table does not know; 60 calls in one attempt
    add(store, "run-gw", "foreign", 0, 1, [call(model="mystery-model", t_in=300, t_out=30)])
    ids["many"] = add(store, "run-gw", "foreign", 1, 1, [call(model="mystery-model", t_in=5, t_out=1, at=i * 0.15, latency=0.1) for i in range(60)])
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    return url, prices, ids


def report(url: str, fmt: str, *extra) -> str:
    r = cli("report", "run-gw", "--format", fmt, "--db", url, *extra)
    assert r.exit_code == 0, r.output
    return r.stdout


def no_secret(text: str) -> None:
    for v in (KEY_VALUE, URL_PASSWORD, URL_TOKEN):
        assert v not in text


# ----------------------------------------------------------------------------- report


def test_json_report_counts_tokens_spent_and_scored_with_cost(gw):
    url, prices, _ = gw
    rep = json.loads(report(url, "json", "--prices", prices))
    u = rep["usage"]
    assert u["spent"]["tokens_in"] == 100 + 1000 + 500 + 2000 + 300 + 60 * 5
    assert u["scored"]["tokens_in"] == 1000 + 500 + 2000 + 300 + 60 * 5  # the discarded attempt's 100 are spent, not scored
    assert u["spent"]["calls"] == 2 + 2 + 1 + 2 + 0 + 1 + 1 + 60
    assert u["spent"]["calls_without_usage"] == 3
    assert u["errors"]["rate_limited"] == 1 and u["discarded_upstream"] == 1
    assert rep["discards"]["by_scope"] == {"host": 1, "upstream": 1}
    # the run's cost is unknown (a model without a price, calls without usage): never a partial sum
    assert u["priced"] and u["spent"]["cost"] is None and (u["tasks_priced"], u["tasks"]) == (1, 3)
    assert u["unpriced_models"] == ["mystery-model"]
    # priced: 100 in/20 out + (600 fresh + 400 cached)/200 + 500/50 + 2000/100 at 0.15 / 0.60 / 0.075 per million
    assert u["cost_priced_tasks"] == pytest.approx(732e-6)
    tasks = {t["task"]: t for t in rep["tasks"]}
    priced = tasks["priced"]["usage"]
    assert priced["spent"]["cost"] == pytest.approx(732e-6) and priced["scored"]["cost"] == pytest.approx(705e-6)
    assert (priced["spent"]["tokens_out"], priced["scored"]["tokens_out"], priced["spent"]["tokens_cached"]) == (370, 350, 400)
    assert priced["discarded_upstream"] == 1 and priced["wait_s"] == pytest.approx(1.2 + 3.0 + 1.5 + 1.0)
    assert priced["working_s"] == pytest.approx(30.0 - priced["wait_s"])
    # null, never 0, where no response reported usage
    silent = tasks["silent"]["usage"]
    assert silent["spent"]["tokens_in"] is None and silent["spent"]["tokens_out"] is None and silent["spent"]["cost"] is None
    assert silent["spent"]["calls"] == 3 and silent["spent"]["attempts"] == 3
    assert tasks["foreign"]["usage"]["spent"]["cost"] is None
    assert rep["identity"]["secrets"] == ["OPENAI_API_KEY"] and rep["identity"]["agent_name"] == "llm"
    no_secret(json.dumps(rep))
    # without a price table every cost is null, the tokens are the same
    bare = json.loads(report(url, "json"))
    assert not bare["usage"]["priced"] and bare["usage"]["spent"]["cost"] is None and bare["usage"]["cost_priced_tasks"] is None
    assert bare["usage"]["spent"]["tokens_in"] == u["spent"]["tokens_in"]


def test_price_table_from_the_environment(gw, monkeypatch):
    url, prices, _ = gw
    monkeypatch.setenv("HARNESS_PRICES", str(prices))
    assert json.loads(report(url, "json"))["usage"]["cost_priced_tasks"] == pytest.approx(732e-6)


def test_text_formats_show_usage_and_no_secret(gw):
    url, prices, _ = gw
    table = " ".join(report(url, "table", "--prices", prices).split())
    for text in ("Model usage", "tokens spent (every attempt, discarded included): in 4,200", "tokens in scored attempts",
                 "rate_limited 1", "1 of 3 tasks priced", "no price for mystery-model", "$0.000732 over the priced tasks only",
                 "discarded by scope: host 1, envelope 0, upstream 1", "secrets held: OPENAI_API_KEY (names only)", "waiting on the model"):
        assert text in table, text
    no_secret(table)

    md = report(url, "markdown", "--prices", prices)
    assert "#### Model usage" in md and "tokens spent in **4,200** / out **" in md and "unknown (1 of 3 tasks priced)" in md
    assert "| task | calls | tokens spent in / out | cached | scored in / out |" in md
    usage_md = md.split("#### Model usage", 1)[1].split("#### ", 1)[0]
    silent_row = next(line for line in usage_md.splitlines() if line.startswith("| silent |"))
    cells = [c.strip() for c in silent_row.strip("|").split("|")]
    assert cells[1] == "3" and cells[2] == "– / –" and cells[3] == "–" and cells[-1] == "–"  # unreported: –, never 0
    priced_row = next(line for line in usage_md.splitlines() if line.startswith("| priced |"))
    assert "3,600 / 370" in priced_row and "$0.000732" in priced_row and "rate_limited 1" in priced_row
    assert "OPENAI_API_KEY" in md
    no_secret(md)

    page = report(url, "html", "--prices", prices)
    assert '<section id="usage"><h2>Model usage</h2>' in page and "3,600 / 370" in page
    no_secret(page)


def test_junit_properties_leave_unknown_values_out(gw):
    url, prices, _ = gw
    xml = report(url, "junit", "--prices", prices)
    no_secret(xml)
    root = ET.fromstring(xml.encode())
    suite = root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["tokens_in"] == "4200" and props["tokens_in_scored"] == "4100" and props["upstream_discards"] == "1"
    assert props["upstream_rate_limited"] == "1" and props["cost_tasks_priced"] == "1 of 3"
    assert "cost_usd" not in props  # unknown: left out, never 0
    cases = {c.get("name"): c for c in root.iter("testcase")}
    cp = {p.get("name"): p.get("value") for p in cases["priced"].find("properties")}
    assert cp["cost_usd"] == "0.000732" and cp["tokens_out"] == "370"
    sp = {p.get("name"): p.get("value") for p in cases["silent"].find("properties")}
    assert sp["model_calls"] == "3" and "tokens_in" not in sp and "cost_usd" not in sp
    assert "model usage: 3 calls" not in xml and "model usage: 5 calls, tokens in 3,600 / out 370" in cases["priced"].find("failure").text


# ----------------------------------------------------------------------------- trials and show


def test_trials_rows_and_table(gw):
    url, prices, ids = gw
    rows = {r["id"]: r for r in json.loads(cli("trials", "run-gw", "--json", "--prices", prices, "--db", url).stdout)}
    c = rows[ids["clean"]]
    assert (c["model_calls"], c["tokens_in"], c["tokens_out"], c["tokens_cached"], c["upstream_errors"]) == (2, 1500, 250, 400, 0)
    assert c["cost_usd"] == pytest.approx(345e-6) and c["wait_s"] == pytest.approx(4.5) and c["working_s"] == pytest.approx(5.5)
    d = rows[ids["discarded"]]
    assert d["upstream_errors"] == 1 and d["reasons"] == ["upstream_rate_limited"]
    s = rows[ids["silent"]]
    assert s["model_calls"] == 2 and s["tokens_in"] is None and s["cost_usd"] is None and s["calls_without_usage"] == 2
    r = cli("trials", "run-gw", "--prices", prices, "--db", url)
    assert r.exit_code == 0, r.output
    for head in ("calls", "tokens in/out", "upstream err", "wait/agent s", "cost $"):
        assert head in r.stdout, head
    assert "1,500/250" in r.stdout and "-/-" in r.stdout  # the silent attempts: not reported, not 0
    csv_text = cli("trials", "run-gw", "--csv", "--db", url).stdout
    assert csv_text.splitlines()[0].endswith("model_calls,tokens_in,tokens_out,tokens_cached,calls_without_usage,upstream_errors,wait_s,working_s,cost_usd,seed,node")
    for out in (r.stdout, csv_text):
        no_secret(out)


def test_show_lists_calls_upstream_summary_and_egress(gw):
    url, prices, ids = gw
    r = cli("show", ids["clean"], "--prices", prices, "--db", url)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    for part in ("model gateway (upstream summary)", "1,500 / 250 / 400", "waiting on the model 4.50s of 10.00s agent wall; working 5.50s",
                 "model calls (2 recorded)", "gpt-4o-mini", "$0.00024", "$0.000105", "egress log (allowed 1, refused 1, dropped 0)",
                 "pypi.org:443", "refused", "not in the allowlist", "api.github.com:443", "allowed"):
        assert part in text, part
    no_secret(r.stdout)
    r = cli("show", ids["discarded"], "--db", url)
    text = " ".join(r.stdout.split())
    assert "429 rate_limited" in text and "429 Too Many Requests" in text and "rate_limited 1" in text
    r = cli("show", ids["many"], "--db", url)
    assert "model calls (60 recorded)" in r.stdout and "10 more call(s)" in r.stdout
    assert sum(1 for line in r.stdout.splitlines() if "mystery-model" in line and "200" in line) == 50
    doc = json.loads(cli("show", ids["silent"], "--json", "--prices", prices, "--db", url).stdout)
    assert doc["attempt"]["model_calls"][0]["tokens_in"] is None and doc["attempt"]["upstream"]["calls_without_usage"] == 2
    assert doc["usage"]["tokens_in"] is None and doc["usage"]["cost"] is None and doc["trial_row"]["tokens_in"] is None
    no_secret(json.dumps(doc))


# ----------------------------------------------------------------------------- without a gateway


def test_run_without_gateway_shows_none_of_it(tmp_path):
    url = f"sqlite:///{tmp_path}/plain.db"
    store = Store.open(url)
    store.add_run(run_record("run-plain", ["a"]))
    aid = add(store, "run-plain", "a", 0, 1, None)
    add(store, "run-plain", "a", 1, 1, None, verdict="discarded", reasons=("host_cpu_contention",))
    add(store, "run-plain", "a", 1, 2, None, outcome="fail")
    prices = tmp_path / "p.toml"
    prices.write_text(PRICES)
    rep = json.loads(cli("report", "run-plain", "--format", "json", "--prices", prices, "--db", url).stdout)
    assert rep["usage"] is None and all(t["usage"] is None for t in rep["tasks"])
    for fmt in ("table", "markdown", "html", "junit"):
        out = cli("report", "run-plain", "--format", fmt, "--prices", prices, "--db", url).stdout
        out = re.sub(r"<script.*?</script>", "", out, flags=re.DOTALL)  # the inlined plotly bundle has words of its own
        for absent in ("Model usage", "tokens", "model_calls", "upstream", "by scope", "model gateway", "cost"):
            assert absent not in out, (fmt, absent)
    r = cli("trials", "run-plain", "--prices", prices, "--db", url)
    assert r.exit_code == 0 and "calls" not in r.stdout and "tokens" not in r.stdout
    row = json.loads(cli("trials", "run-plain", "--json", "--db", url).stdout)[0]
    assert row["model_calls"] is None and row["tokens_in"] is None and row["cost_usd"] is None
    r = cli("show", aid, "--db", url)
    assert r.exit_code == 0 and "model gateway" not in r.stdout and "model calls" not in r.stdout and "egress" not in r.stdout


# ----------------------------------------------------------------------------- price table


def test_price_table_errors_name_the_file_and_key(gw, tmp_path, monkeypatch):
    url, _, _ = gw
    cases = {
        "[models.m]\ninput = 1\n": 'models."m".output: missing',
        "[models.m]\ninput = -1\noutput = 1\n": 'models."m".input: expected a number >= 0',
        '[models.m]\ninput = "cheap"\noutput = 1\n': 'models."m".input: expected a number >= 0',
        "[models.m]\ninput = 1\noutput = 1\nreasoning = 2\n": 'models."m".reasoning: unknown key',
        "[price]\nx = 1\n": "unknown key 'price'",
        "models = 3\n": 'no [models."NAME"] table',
        "[models.m\n": "not valid TOML",
    }
    for i, (text, msg) in enumerate(cases.items()):
        f = tmp_path / f"bad{i}.toml"
        f.write_text(text)
        r = cli("report", "run-gw", "--prices", f, "--db", url)
        assert r.exit_code == 2, text
        line = " ".join(r.stderr.split())
        assert f"--prices {f}" in line and msg in line, (text, line)
        for cmd in (("trials", "run-gw"), ("show", "1")):
            assert cli(*cmd, "--prices", f, "--db", url).exit_code == 2
    r = cli("report", "run-gw", "--prices", tmp_path / "nope.toml", "--db", url)
    assert r.exit_code == 2 and "cannot read" in r.stderr
    monkeypatch.setenv("HARNESS_PRICES", str(tmp_path / "nope.toml"))
    r = cli("report", "run-gw", "--db", url)
    assert r.exit_code == 2 and "$HARNESS_PRICES" in r.stderr
    with pytest.raises(UsageError):
        parse_prices("[models.m]\ninput = true\noutput = 1\n", "x")
    assert parse_prices(PRICES, "x") == {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached": 0.075}}
    assert prices_from_option(None, {}) is None and prices_from_option(None, {"HARNESS_PRICES": " "}) is None


def test_discard_scopes_from_rules_or_names():
    from types import SimpleNamespace

    a = SimpleNamespace(reasons=["upstream_timeout", "cpu_throttled", "host_steal"], rules=[])
    assert discard_scopes(a) == ["upstream", "envelope", "host"]
    b = SimpleNamespace(reasons=["custom"], rules=[{"rule": "custom", "scope": "upstream", "breached": True}])
    assert discard_scopes(b) == ["upstream"]


def test_calls_beyond_the_record_cap_make_the_cost_unknown():
    from types import SimpleNamespace

    from harness.report.usage import token_use

    calls = [call(t_in=10, t_out=1)]
    prices = parse_prices(PRICES, "x")
    full = SimpleNamespace(model_calls=[c.model_dump() for c in calls], upstream=summarize(calls).model_dump())
    capped = SimpleNamespace(model_calls=[c.model_dump() for c in calls], upstream=summarize(calls, dropped=5).model_dump())
    assert token_use([full], prices)["cost"] == pytest.approx(10 * 0.15e-6 + 0.6e-6)
    t = token_use([full, capped], prices)
    assert t["cost"] is None and t["calls"] == 7 and t["calls_unrecorded"] == 5 and t["tokens_in"] == 20
    assert token_use([full], None)["cost"] is None  # no price table: unknown, not 0
