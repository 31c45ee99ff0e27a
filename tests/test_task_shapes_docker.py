"""Task shapes on real containers: the `files` and `postgres` state kinds, the `verifier`
grader (shared and separate), per-attempt services, Harbor task directories with the
built-in oracle / nop agents, and `harness suites check`."""

from __future__ import annotations

import json
import tarfile
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from harness.sandbox.owners import LABEL
from harness.store.store import Store

pytestmark = pytest.mark.docker


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
        if rel.endswith(".sh"):
            p.chmod(0o755)
    return root


def run_json(tmp_path: Path, suite: Path, *args: str, ok: bool = True) -> tuple[dict, Store]:
    db = f"sqlite:///{tmp_path}/h.db"
    r = run_cli(tmp_path, "run", "--suite", str(suite), "--db", db, "--json", *args)
    assert (r.returncode == 0) == ok or r.returncode in (0, 1), r.stderr[-3000:]
    assert r.stdout.strip(), r.stderr[-3000:]
    return json.loads(r.stdout), Store.open(db, mode="ro")


def by_task(store: Store, run_id: str, clean_only: bool = True) -> dict[str, list]:
    """Attempts per task; by default the clean ones (a slot rerun after the host's contention
    has a discarded attempt too, which is evidence, not the slot's result)."""
    out: dict[str, list] = {}
    for a in store.attempts(run_id):
        if a.verdict == "clean" or not clean_only:
            out.setdefault(a.task_id, []).append(a)
    return out


def clean(store: Store, run_id: str) -> list:
    return [a for a in store.attempts(run_id) if a.verdict == "clean"]


def leftovers(client, run_id: str) -> list[str]:
    cs = client.containers.list(all=True, filters={"label": f"{LABEL}.run={run_id}"})
    nets = [n for n in client.networks.list() if (n.attrs.get("Labels") or {}).get(f"{LABEL}.run") == run_id]
    return [c.name for c in cs] + [n.name for n in nets]


# -- state kind `files` --------------------------------------------------------------------

FILES_SUITE = {
    "suite.toml": """\
        name = "shapes-files"
        image = "harness/sandbox:latest"
        dockerfile = ""
        state = "files"
        trials = 1
        k = [1]
        agent_cmd = ["python3", "-c", '''
        import json, os, pathlib
        root = pathlib.Path(os.environ["HARNESS_STATE"])
        cfg = json.loads((root / "config.json").read_text())
        cfg["server"]["port"] = 8080
        (root / "config.json").write_text(json.dumps(cfg, indent=2))
        task = os.environ["HARNESS_TASK_ID"]
        if task == "extra":
            (root / "data" / "notes.txt").write_text("oops")
        if task == "link":
            os.symlink("/etc/passwd", root / "data" / "passwd")
        if task == "toml":
            (root / "app.toml").write_text('[db]\\nport = 5433\\n')
        if task == "midlink":
            os.makedirs("/tmp/x", exist_ok=True)
            pathlib.Path("/tmp/x/x.txt").write_text("ok")
            os.symlink("/tmp/x", root / "data" / "sub")
        ''']
        """,
    "fixtures/cfg/config.json": '{"server": {"host": "0.0.0.0", "port": 80}}\n',
    "fixtures/cfg/app.toml": "[db]\nport = 5432\n",
    "fixtures/cfg/data/keep.txt": "keep me\n",
    **{f"tasks/{t}.toml": f"""\
        id = "{t}"
        title = "set the port"
        prompt = "Set server.port to 8080 in config.json"
        unchanged = ["/work/app/data/keep.txt"]
        allow = ["/work/app/config.json"{', "/work/app/app.toml"' if t == "toml" else ""}{', "/work/app/data/sub"' if t == "midlink" else ""}]
        [state]
        path = "/work/app"
        fixture = "fixtures/cfg"
        [[expect]]
        path = "/work/app/config.json"
        json = "server.port"
        equals = 8080
        [[expect]]
        path = "/work/app/config.json"
        matches = "0\\\\.0\\\\.0\\\\.0"
        [[expect]]
        path = "/work/app/gone.txt"
        exists = false
        {'''[[expect]]
        path = "/work/app/app.toml"
        toml = "db.port"
        equals = 5433''' if t == "toml" else ""}
        {'''[[expect]]
        path = "/work/app/data/sub/x.txt"
        contains = "ok"''' if t == "midlink" else ""}
        """ for t in ("fix", "extra", "link", "toml", "midlink")},
}


def test_files_state_graded_by_expectations_extra_effects_and_links(docker_client, tmp_path):
    suite = write(tmp_path / "suite", FILES_SUITE)
    out, store = run_json(tmp_path, suite)
    tasks = by_task(store, out["run_id"])
    assert {t: [a.outcome for a in v] for t, v in tasks.items()} == {"fix": ["pass"], "toml": ["pass"], "extra": ["fail"], "link": ["fail"],
                                                                   "midlink": ["fail"]}
    assert "goes through /work/app/data/sub, which is a link" in tasks["midlink"][0].grade_reason
    extra = tasks["extra"][0]
    assert extra.failure_kind == "wrong_state" and "extra effect" in extra.grade_reason and "/work/app/data/notes.txt" in extra.grade_reason
    link = tasks["link"][0]
    assert "extra effect" in link.grade_reason and "/work/app/data/passwd" in link.grade_reason
    # the link is kept as a link: never followed out of the tree
    with tarfile.open(Path(link.artifacts) / "files-0.tar") as tf:
        m = tf.getmember("app/data/passwd")
        assert m.issym() and m.linkname == "/etc/passwd"
    assert leftovers(docker_client, out["run_id"]) == []


# -- the verifier grader on Harbor task directories ----------------------------------------

def harbor(root: Path, name: str, test_sh: str, *, verifier: str = "timeout_sec = 20.0", artifacts: str = '["/app/out.txt"]',
           extra_files: dict[str, str] | None = None, solve: str = "echo hello > /app/out.txt\n") -> None:
    write(root / name, {
        "task.toml": f"""\
            version = "1.0"
            artifacts = {artifacts}
            [verifier]
            {verifier}
            [agent]
            timeout_sec = 60.0
            [environment]
            cpus = 1
            memory_mb = 512
            allow_internet = false
            """,
        "instruction.md": "Write hello to /app/out.txt.\n",
        "environment/Dockerfile": "FROM python:3.12-slim\nWORKDIR /app\nRUN echo original > /app/other.txt\n",
        "tests/test.sh": test_sh,
        "solution/solve.sh": "#!/bin/bash\n" + solve,
        **(extra_files or {}),
    })


CHECK_OUT = """\
    #!/bin/bash
    # MARKER-7f3e: the agent must never see this file
    if [ "$(cat /app/out.txt 2>/dev/null)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
    """

AGENT = r"""
set -u
case "$HARNESS_TASK_ID" in
  peek)   (ls -la /tests; cat /tests/test.sh; find / -name test.sh -path '*tests*' 2>/dev/null) > /app/seen.txt 2>&1; echo hello > /app/out.txt ;;
  forge)  echo 1 > /logs/verifier/reward.txt; echo '{"reward": 1}' > /logs/verifier/reward.json
          (while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; done) & ;;
  vandal) rm -rf /logs/verifier; mkdir -p /tests; echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh; chmod 000 /logs ;;
  hang|garbage|json|ctrf|separate) echo hello > /app/out.txt; echo agent-only > /app/other.txt ;;
  smuggle) ln -s /tests/expected.txt /app/out.txt ;;
  plant)  printf 'import sys\nsys.exit(0)\n' > /app/unittest.py ;;
esac
exit 0
"""


def test_verifier_shared_and_separate_rewards_and_tampering(docker_client, tmp_path):
    s = tmp_path / "harbor"
    harbor(s, "peek", CHECK_OUT, artifacts='["/app/out.txt", "/app/seen.txt"]')
    harbor(s, "forge", "#!/bin/bash\nexit 1\n")  # writes no reward: a forged one must not count
    harbor(s, "vandal", CHECK_OUT)
    harbor(s, "hang", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nsleep 600\n", verifier="timeout_sec = 3.0")
    harbor(s, "garbage", "#!/bin/bash\necho 'all good!' > /logs/verifier/reward.txt\n")
    harbor(s, "json", "#!/bin/bash\necho '{\"reward\": 0.75, \"style\": 1.0}' > /logs/verifier/reward.json\n")
    # a verifier that copies the agent's answer into reward.json: 400 digits are no float (the
    # controller's OverflowError made the attempt an infrastructure discard the agent chose)
    harbor(s, "huge", "#!/bin/bash\necho \"{\\\"reward\\\": 0, \\\"answer\\\": 1$(printf '0%.0s' $(seq 400))}\" "
                      "> /logs/verifier/reward.json\n")
    harbor(s, "ctrf", """\
        #!/bin/bash
        echo "verifier says hi"
        cat > /logs/verifier/ctrf.json <<'J'
        {"results": {"tool": {"name": "pytest"}, "summary": {"tests": 2, "passed": 1, "failed": 1},
         "tests": [{"name": "test_ok", "status": "passed"}, {"name": "test_bad", "status": "failed", "message": "assert 1 == 2"}]}}
        J
        echo 0 > /logs/verifier/reward.txt
        """)
    harbor(s, "separate", """\
        #!/bin/bash
        # a fresh container from the task image: the declared artifacts only
        if [ "$(cat /app/out.txt)" = "hello" ] && [ "$(cat /app/other.txt)" = "original" ]; then r=1; else r=0; fi
        echo $r > /logs/verifier/reward.txt
        """, verifier='timeout_sec = 20.0\nenvironment_mode = "separate"')
    write(s, {"harness.toml": 'name = "shapes-harbor"\nagent_cmd = ["bash", "/harness/agent/agent.sh"]\nagent_dir = "agent"\n'
                              'trials = 1\nk = [1]\nmax_reruns = 3\n', "agent/agent.sh": AGENT})
    harbor(s, "smuggle", "#!/bin/bash\nif cmp -s /app/out.txt /tests/expected.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
           verifier='timeout_sec = 20.0\nenvironment_mode = "separate"', extra_files={"tests/expected.txt": "the answer\n"})
    harbor(s, "plant", "#!/bin/bash\ncd /app && python3 -m unittest discover -s /tests && echo 1 > /logs/verifier/reward.txt "
                       "|| echo 0 > /logs/verifier/reward.txt\n", artifacts='["/app"]',
           verifier='timeout_sec = 20.0\nenvironment_mode = "separate"',
           extra_files={"tests/test_out.py": "import unittest\n\nclass T(unittest.TestCase):\n    def test_out(self):\n"
                                             "        self.assertEqual(open('/app/out.txt').read(), 'hello\\n')\n"})
    out, store = run_json(tmp_path, s, ok=False)
    tasks = {t: v[0] for t, v in by_task(store, out["run_id"]).items()}
    # a module the agent left in the carried working directory is not what the verifier imports
    assert tasks["plant"].outcome == "fail" and tasks["plant"].reward == 0.0, (tasks["plant"].grade_reason, tasks["plant"].error)
    smuggle = tasks["smuggle"]
    assert smuggle.outcome == "fail" and "not carried" in (smuggle.error or ""), (smuggle.grade_reason, smuggle.error)

    peek = tasks["peek"]
    assert peek.outcome == "pass"
    with tarfile.open(Path(peek.artifacts) / "artifact-2.tar") as tf:  # the task's second artifact, /app/seen.txt
        seen = tf.extractfile(tf.getmembers()[0]).read().decode()
    assert "MARKER-7f3e" not in seen and "No such file" in seen, seen

    forge = tasks["forge"]
    assert forge.outcome == "fail" and forge.failure_kind == "ungradable" and forge.reward is None, forge.grade_reason
    with tarfile.open(Path(forge.artifacts) / "verifier-dir-before-grading.tar") as tf:  # the forgery is kept as evidence
        assert any(m.name.endswith("reward.txt") for m in tf.getmembers()), tf.getnames()
    vandal = tasks["vandal"]
    assert vandal.outcome == "fail" and vandal.reward == 0.0, vandal.grade_reason

    hang = tasks["hang"]
    assert hang.failure_kind == "ungradable" and hang.reward is None
    assert hang.grade_wall_s is not None and hang.grade_wall_s < 15, hang.grade_wall_s
    assert "killed at the grade timeout" in hang.grade_reason  # its early reward.txt = 1 does not count

    garbage = tasks["garbage"]
    assert garbage.failure_kind == "ungradable" and "reward.txt is not one number" in garbage.grade_reason

    huge = tasks["huge"]
    assert huge.verdict == "clean" and huge.failure_kind == "ungradable" and "'answer' is not a finite number" in huge.grade_reason, \
        (huge.verdict, huge.reasons, huge.grade_reason, huge.error)

    js = tasks["json"]
    assert js.outcome == "fail" and js.reward == 0.75 and js.rewards == {"reward": 0.75, "style": 1.0}
    assert "0.75 < threshold 1" in js.grade_reason

    ctrf = tasks["ctrf"]
    names = {c["name"]: c["passed"] for c in ctrf.grade_checks}
    assert names.get("test_ok") is True and names.get("test_bad") is False, ctrf.grade_checks
    art = Path(ctrf.artifacts)
    assert any("verifier says hi" in p.read_text(errors="replace") for p in art.rglob("*stdout*") if p.is_file())
    shown = run_cli(tmp_path, "show", str(ctrf.id), "--db", f"sqlite:///{tmp_path}/h.db")
    assert shown.returncode == 0 and "test_bad" in shown.stdout and "verifier says hi" in shown.stdout, shown.stdout[-2000:]

    sep = tasks["separate"]
    assert sep.outcome == "pass" and sep.reward == 1.0, sep.grade_reason
    assert leftovers(docker_client, out["run_id"]) == []


# -- per-attempt services ------------------------------------------------------------------

SERVICE_SUITE = {
    "suite.toml": """\
        name = "shapes-svc"
        image = "harness/sandbox:latest"
        dockerfile = ""
        state = "files"
        trials = 2
        k = [1]
        max_reruns = 1
        agent_cmd = ["python3", "-c", '''
        import os, pathlib, socket, urllib.request
        body = urllib.request.urlopen("http://api:8000/answer.txt", timeout=10).read().decode()
        pathlib.Path(os.environ["HARNESS_STATE"], "answer.txt").write_text(body)
        gws = []
        for line in open("/proc/net/route").read().splitlines()[1:]:
            f = line.split()
            if f[2] != "00000000":
                gws.append(socket.inet_ntoa(bytes.fromhex(f[2])[::-1]))
        for host in [*gws, "172.17.0.1"]:
            s = socket.socket()
            s.settimeout(2)
            print("host-reach", host, s.connect_ex((host, int(os.environ["HOST_PORT"]))))
        ''']
        """,
    "tasks/ask.toml": """\
        id = "ask"
        title = "fetch the answer from the service"
        prompt = "GET http://api:8000/answer.txt and save it."
        allow = ["/work/out/answer.txt"]
        [state]
        path = "/work/out"
        [[expect]]
        path = "/work/out/answer.txt"
        equals = "42\\n"
        [[services]]
        name = "api"
        image = "harness/sandbox:latest"
        command = ["sh", "-c", "mkdir -p /tmp/www && echo 42 > /tmp/www/answer.txt && cd /tmp/www && exec python3 -m http.server 8000"]
        health = ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/answer.txt', timeout=2)"]
        memory = "64m"
        """,
    "tasks/sick.toml": """\
        id = "sick"
        title = "a service that never becomes healthy"
        prompt = "unused"
        allow = ["/work/out/answer.txt"]
        [state]
        path = "/work/out"
        [[expect]]
        path = "/work/out/answer.txt"
        exists = true
        [[services]]
        name = "api"
        image = "harness/sandbox:latest"
        command = ["sleep", "600"]
        health = ["false"]
        health_timeout = 2
        """,
}


def test_services_reachable_by_name_measured_and_removed_and_unhealthy_is_infra(docker_client, tmp_path):
    import http.server
    import threading

    host = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)  # on every host address
    threading.Thread(target=host.serve_forever, daemon=True).start()
    suite = write(tmp_path / "svc", SERVICE_SUITE)
    (suite / "suite.toml").write_text((suite / "suite.toml").read_text() + f'[agent_env]\nHOST_PORT = "{host.server_address[1]}"\n')
    try:
        out, store = run_json(tmp_path, suite, ok=False)
    finally:
        host.shutdown()
    tasks = by_task(store, out["run_id"], clean_only=False)
    ask = [a for a in tasks["ask"] if a.verdict == "clean"]
    assert [a.outcome for a in ask] == ["pass", "pass"]
    for a in ask:
        reach = [ln.split() for ln in (Path(a.artifacts) / "stdout.txt").read_text().splitlines() if ln.startswith("host-reach")]
        assert reach and all(r[2] != "0" for r in reach), reach  # the host is not reachable from the attempt's network
        svc = a.services["api"]
        assert svc["image"] == "harness/sandbox:latest" and svc["counters"], svc
        assert svc["envelope_applied"]["memory_max"] == 64 * 2**20
    # never healthy: every attempt discarded as infrastructure, the slot rerun, then unmeasured
    sick = tasks["sick"]
    assert len(sick) == 4 and all(a.verdict == "discarded" for a in sick)
    assert all("service api" in (a.error or "") and "healthy" in (a.error or "") for a in sick), [a.error for a in sick]
    assert leftovers(docker_client, out["run_id"]) == []


# -- state kind `postgres` -----------------------------------------------------------------

PG_SUITE = {
    "suite.toml": """\
        name = "shapes-pg"
        image = "harness/postgres:15"
        dockerfile = ""
        state = "postgres"
        trials = 2
        k = [1]
        state_sql = ["schema.sql"]
        agent_cmd = ["sh", "/harness/agent/agent.sh"]
        agent_dir = "agent"
        """,
    "agent/agent.sh": """\
        set -e
        if [ "$HARNESS_TASK_ID" = forge ]; then
          # look-alike tables in a schema of its own, put first on the database's search_path
          psql -v ON_ERROR_STOP=1 -c "CREATE SCHEMA forge" \\
               -c "CREATE VIEW forge.accounts AS SELECT 1 AS id, 50::numeric AS balance UNION ALL SELECT 2, 70.5" \\
               -c "ALTER DATABASE app SET search_path = forge, public"
          exit 0
        fi
        psql -v ON_ERROR_STOP=1 -c "UPDATE accounts SET balance = balance - 50 WHERE id = 1; UPDATE accounts SET balance = balance + 50 WHERE id = 2;"
        if [ "$HARNESS_TASK_ID" = sloppy ]; then psql -c "INSERT INTO audit(note) VALUES ('manual');"; fi
        """,
    "schema.sql": """\
        CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);
        CREATE TABLE audit (id serial PRIMARY KEY, note text);
        INSERT INTO accounts VALUES (1, 'ana', 100.00), (2, 'bo', 20.50);
        """,
    **{f"tasks/{t}.toml": f"""\
        id = "{t}"
        title = "move 50 from ana to bo"
        prompt = "Transfer 50 from account 1 to account 2."
        allow = ["accounts.balance"]
        [[expect]]
        name = "balances"
        query = "SELECT id, balance FROM accounts ORDER BY id"
        rows = [[1, 50], [2, 70.5]]
        """ for t in ("transfer", "sloppy", "forge")},
}


def test_postgres_state_per_attempt_database_graded_with_full_diff(docker_client, tmp_path):
    suite = write(tmp_path / "pg", PG_SUITE)
    out, store = run_json(tmp_path, suite)
    tasks = by_task(store, out["run_id"])
    # each attempt starts from the fixture: the same transfer passes twice
    assert [a.outcome for a in tasks["transfer"]] == ["pass", "pass"]
    sloppy = tasks["sloppy"]
    assert all(a.outcome == "fail" and "extra effect" in a.grade_reason and "audit" in a.grade_reason for a in sloppy)
    for a in tasks["transfer"]:
        assert "db" in a.services and a.services["db"]["counters"]
    # a search_path the agent set on its database does not reach the grader's sessions
    forge = tasks["forge"]
    assert all(a.outcome == "fail" for a in forge), [a.grade_reason for a in forge]
    assert all("expected" in a.grade_reason or "forge" in a.grade_reason for a in forge), [a.grade_reason for a in forge]
    checks = " ".join(c.get("detail") or "" for c in forge[0].grade_checks)
    assert "new setting on database app" in checks and "search_path=forge" in checks, forge[0].grade_checks
    assert leftovers(docker_client, out["run_id"]) == []


# -- oracle, nop and `suites check` --------------------------------------------------------

def test_suites_check_reports_broken_tasks_in_one_line_each(docker_client, tmp_path):
    s = tmp_path / "check"
    harbor(s, "good", CHECK_OUT)
    harbor(s, "unsolvable", CHECK_OUT, solve="echo goodbye > /app/out.txt\n")
    harbor(s, "lenient", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    r = run_cli(tmp_path, "suites", "check", str(s), "--db", f"sqlite:///{tmp_path}/h.db", "--json")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    doc = json.loads(r.stdout)
    verdicts = {t["task"]: t for t in doc["tasks"]}
    assert verdicts["good"]["ok"] and verdicts["good"]["oracle"] == "pass" and verdicts["good"]["nop"] == "fail"
    assert not verdicts["unsolvable"]["ok"] and "oracle" in " ".join(verdicts["unsolvable"]["reasons"])
    assert not verdicts["lenient"]["ok"] and "nop" in " ".join(verdicts["lenient"]["reasons"])
    # a task that cannot be built is one line, not a traceback
    harbor(s, "nobase", CHECK_OUT)
    (s / "nobase" / "environment" / "Dockerfile").write_text("FROM example.invalid/nothing:1\n")
    r = run_cli(tmp_path, "suites", "check", str(s), "--tasks", "nobase,good", "--db", f"sqlite:///{tmp_path}/h.db")
    assert "Traceback" not in r.stderr and "nobase" in (r.stdout + r.stderr) and "--base-map" in (r.stdout + r.stderr)


def test_an_unmapped_base_is_shown_before_a_run_and_is_exit_2_everywhere(docker_client, tmp_path):
    """suites show marks it (with what to map) before anything runs; images build and run
    refuse it with exit 2 (the suite's or the caller's to fix, not the infrastructure's) and
    the whole line; --base-map makes it buildable."""
    s = tmp_path / "bases"
    harbor(s, "nobase", CHECK_OUT)
    (s / "nobase" / "environment" / "Dockerfile").write_text("FROM example.invalid/nothing:1\nWORKDIR /app\n")
    r = run_cli(tmp_path, "suites", "show", str(s), "--json")
    assert r.returncode == 0, r.stderr
    err = json.loads(r.stdout)["tasks"][0]["image_error"]
    assert "example.invalid/nothing:1" in err and "--base-map" in err
    r = run_cli(tmp_path, "images", "build", "--suite", str(s))
    assert r.returncode == 2 and "nobase" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    r = run_cli(tmp_path, "run", "--suite", str(s), "--agent", "oracle", "--db", f"sqlite:///{tmp_path}/h.db")
    assert r.returncode == 2 and "or `docker load` it" in r.stderr, r.stderr[-1500:]  # the line whole, not cut at 300
    mapped = ["--base-map", "example.invalid/nothing:1=harness/debian:bookworm"]
    r = run_cli(tmp_path, "suites", "show", str(s), "--json", *mapped)
    assert "image_error" not in json.loads(r.stdout)["tasks"][0], r.stdout


def test_builtin_ops_suite_every_oracle_passes_every_nop_fails(docker_client, tmp_path):
    r = run_cli(tmp_path, "suites", "check", "ops", "--db", f"sqlite:///{tmp_path}/h.db", "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert len(doc["tasks"]) >= 8 and all(t["ok"] for t in doc["tasks"]), doc["tasks"]


# -- verifiers that install their tools at test time (the common public pattern) ----------

PUBLIC_TEST = """\
    #!/bin/bash
    apt-get update
    apt-get install -y curl
    curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
    source $HOME/.local/bin/env
    uvx \\
      -p 3.13 \\
      -w pytest==8.4.1 \\
      -w pytest-json-ctrf==0.3.5 \\
      pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
    if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
    """

PUBLIC_VENV_TEST = """\
    #!/bin/bash
    set -euo pipefail
    if ! command -v uv &> /dev/null; then
        curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
        source $HOME/.local/bin/env
    fi
    uv venv .tbench-testing > /dev/null 2>&1
    source .tbench-testing/bin/activate
    uv pip install pytest==8.4.1 > /dev/null 2>&1
    set +e
    pytest /tests/test_outputs.py -rA
    if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
    """

PUBLIC_TESTS_PY = """\
    from pathlib import Path

    def test_greeting():
        assert Path("/app/greeting.txt").read_text() == "Hello, world!\\n"
    """


def test_verifiers_that_fetch_uv_and_pytest_at_test_time_work_offline(docker_client, tmp_path):
    s = tmp_path / "public"
    for name, script, base in (("uvx-style", PUBLIC_TEST, "ubuntu:24.04"), ("venv-style", PUBLIC_VENV_TEST, "python:3.13-slim-bookworm")):
        # the verifier makes a venv and installs pytest from the prefetched wheels: seconds, but
        # several times that on a loaded CI host, so its timeout is not what this test is about
        harbor(s, name, script, solve='echo "Hello, world!" > /app/greeting.txt\n', artifacts="[]",
               extra_files={"tests/test_outputs.py": PUBLIC_TESTS_PY}, verifier="timeout_sec = 120.0")
        (s / name / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    # a prebuilt image (cannot be pulled offline) beside a Dockerfile: the Dockerfile is built
    toml = s / "uvx-style" / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "example.invalid/prebuilt:1"\n'))
    # the standard envelope with the host rules loosened: a loaded CI host discarded the short
    # nop attempt for foreign CPU until it was unmeasured; what is checked here is the grading
    loose = tmp_path / "loose.toml"
    loose.write_text((Path(__file__).parents[1] / "harness" / "sandboxes" / "standard.toml").read_text()
                     .replace("foreign_cpu_share = 0.10", "foreign_cpu_share = 1.0").replace("steal_share = 0.05", "steal_share = 1.0"))
    r = run_cli(tmp_path, "suites", "check", str(s), "--profile", str(loose), "--db", f"sqlite:///{tmp_path}/h.db", "--json")
    doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    assert r.returncode == 0, ([(t["task"], t["reasons"]) for t in doc.get("tasks", []) if not t["ok"]], r.stderr[-2000:])
    assert all(t["ok"] for t in doc["tasks"]) and len(doc["tasks"]) == 2, doc["tasks"]
    store = Store.open(f"sqlite:///{tmp_path}/h.db", mode="ro")
    oracle = [a for a in clean(store, doc["runs"][0]) if a.task_id == "uvx-style"][0]
    said = (Path(oracle.artifacts) / "verifier-stderr.txt").read_text()
    assert "using this image's /usr/bin/python3" in said and "installer was not fetched" in said
    run = store.get_run(doc["runs"][0])
    assert "built here from" in run.identity.substitutions["example.invalid/prebuilt:1"]
    # each task's own substitutions are kept: `show` names this attempt's bases, not the run's
    assert set(run.task_bases["uvx-style"]) == {"example.invalid/prebuilt:1", "ubuntu:24.04"}, run.task_bases
    assert run.task_bases["venv-style"] == ["python:3.13-slim-bookworm"], run.task_bases
    shown = run_cli(tmp_path, "show", str(oracle.id), "--db", f"sqlite:///{tmp_path}/h.db")
    assert shown.returncode == 0, shown.stderr
    assert "in place of ubuntu:24.04" in shown.stdout and "python:3.13" not in shown.stdout, shown.stdout


def test_terminal_bench_task_yaml_with_its_sourced_helpers_passes_with_oracle(docker_client, tmp_path):
    write(tmp_path / "tb" / "hello-tb", {
        "task.yaml": "instruction: Create hello.txt in the current directory containing Hello, world!\n"
                     "parser_name: pytest\nmax_agent_timeout_sec: 60\nmax_test_timeout_sec: 60\n",
        "Dockerfile": "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nWORKDIR /app\n",
        "run-tests.sh": "#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\nbash $TEST_DIR/run-uv-pytest.sh\n",
        "solution.sh": "#!/bin/bash\necho 'Hello, world!' > hello.txt\n",
        "tests/test_outputs.py": "from pathlib import Path\n\ndef test_hello():\n    assert Path('/app/hello.txt').read_text().strip() == 'Hello, world!'\n",
    })
    out, store = run_json(tmp_path, tmp_path / "tb", "--agent", "oracle", "--trials", "1", "--k", "1")
    [a] = clean(store, out["run_id"])
    assert a.outcome == "pass" and a.reward == 1.0, (a.grade_reason, a.error)


def test_a_verifier_directory_the_agent_locked_is_never_read_as_its_reward(docker_client, tmp_path):
    # read-only root (a native suite): /logs is the agent's own tmpfs, so it can chmod it
    suite = write(tmp_path / "lock", {
        "suite.toml": """\
            name = "shapes-lock"
            image = "harness/sandbox:latest"
            dockerfile = ""
            state = "files"
            trials = 1
            k = [1]
            max_reruns = 3
            agent_cmd = ["sh", "-c", "echo 1 > /logs/verifier/reward.txt; chmod 444 /logs/verifier/reward.txt; chmod 555 /logs/verifier; chmod 555 /logs; cp /usr/bin/python3 /tmp/unittest.py 2>/dev/null; true"]
            """,
        "tests/check/test.sh": "#!/bin/sh\necho 0 > /logs/verifier/reward.txt\n",
        "tasks/t.toml": """\
            id = "t"
            title = "locked verifier dir"
            prompt = "nothing"
            [state]
            path = "/work/out"
            [grader]
            kind = "verifier"
            tests = "tests/check"
            """,
    })
    out, store = run_json(tmp_path, suite, ok=False)
    [a] = clean(store, out["run_id"])
    assert a.outcome == "fail" and a.reward in (None, 0.0), (a.reward, a.grade_reason, a.error)


def test_files_state_in_a_writable_root_sees_an_outward_link_as_a_change(docker_client, tmp_path):
    # a Harbor-format files task (ops/config-repair): graded in a fresh container, links carried as links
    import shlex

    code = ("import json, os\n"
            "p = '/app/config/service.toml'\n"
            "t = open(p).read().replace('port = \"80a\"', 'port = 8080')\n"
            "open(p, 'w').write(t)\n"
            "q = '/app/config/settings.json'\n"
            "c = json.load(open(q)); c['workers'] = 4; json.dump(c, open(q, 'w'))\n"
            "os.symlink('/etc/passwd', '/app/config/pw')\n")
    out, store = run_json(tmp_path, Path("ops"), "--tasks", "config-repair", "--trials", "1", "--k", "1", "--max-reruns", "8",
                          "--agent-cmd", shlex.join(["python3", "-c", code]), ok=False)
    [a] = clean(store, out["run_id"])
    assert a.outcome == "fail" and "extra effect" in a.grade_reason and "/app/config/pw" in a.grade_reason, (a.grade_reason, a.error)
