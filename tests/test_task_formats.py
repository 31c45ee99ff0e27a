"""Harbor / Terminal-Bench task directories as suites, the Dockerfile translator and the base
map: what is mapped to what, and what is refused with one line naming the file and key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.engine.suites import load_suite
from harness.model.errors import SuiteError
from harness.sandbox.basemap import BaseMap
from harness.sandbox.dockerfile import DockerfileError, translate

HARBOR_TOML = """\
version = "1.0"
artifacts = ["/app/out.txt"]
[task]
name = "acme/{name}"
description = "Write out.txt"
[metadata]
difficulty = "easy"
category = "text"
tags = ["a", "b"]
[verifier]
timeout_sec = 45.0
{verifier}
[agent]
timeout_sec = 90.0
[environment]
cpus = 1.5
memory_mb = 768
storage_mb = 2048
allow_internet = false
workdir = "/app"
env = {{ MODE = "test" }}
{env}
{extra}
"""


def harbor_task(root: Path, name: str = "hello", verifier: str = "", env: str = "", extra: str = "",
                test_sh: bool = True, dockerfile: str = "FROM python:3.12-slim\nWORKDIR /app\n") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(HARBOR_TOML.format(name=name, verifier=verifier, env=env, extra=extra))
    (d / "instruction.md").write_text("Write hello to /app/out.txt.\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    if test_sh:
        (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/out.txt\n")
    return d


def load_error(path: Path) -> str:
    with pytest.raises(SuiteError) as e:
        load_suite(str(path))
    return str(e.value)


def test_harbor_fields_map_to_the_task(tmp_path):
    harbor_task(tmp_path)
    s = load_suite(str(tmp_path))
    assert s.format == "harbor" and [t.id for t in s.tasks] == ["hello"]
    t = s.tasks[0]
    env = t.envelope
    assert env.cpus == 1.5 and env.cores == 2
    assert env.memory == 768 * 2**20 and env.storage == 2048 * 2**20
    assert env.network == "none"  # allow_internet = false
    assert env.timeouts == {"agent": 90.0, "grade": 45.0}
    assert t.state_kind == "container" and t.state.artifacts == ["/app/out.txt"]
    g = t.grader
    assert g.kind == "verifier" and g.command == ["bash", "/tests/test.sh"] and g.mode == "shared" and g.threshold == 1.0
    assert t.sandbox.workdir == "/app" and t.sandbox.writable_root and t.sandbox.logs
    assert t.sandbox.env == {"MODE": "test"}
    assert t.solution and t.build is not None and t.build.dockerfile == "Dockerfile"
    assert {"a", "b", "difficulty:easy", "category:text"} <= set(t.tags)
    assert t.prompt.startswith("Write hello")


def test_one_task_directory_is_a_suite_too(tmp_path):
    d = harbor_task(tmp_path, "solo")
    s = load_suite(str(d))
    assert [t.id for t in s.tasks] == ["solo"]


def test_separate_verifier_and_its_own_image(tmp_path):
    d = harbor_task(tmp_path, verifier='environment_mode = "separate"')
    (d / "tests" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    t = load_suite(str(tmp_path)).tasks[0]
    assert t.grader.mode == "separate" and t.grader.build is not None and t.grader.image.endswith("-verifier:latest")


@pytest.mark.parametrize("extra,file,key", [
    ('[[steps]]\nname = "one"\n', "task.toml", "steps"),
    ("", "task.toml", "environment.gpus"),
    ("", "task.toml", "environment.os"),
    ("", "task.toml", "environment.network_mode"),
    ("", "task.toml", "environment.env.TOKEN"),
])
def test_unsupported_harbor_parts_are_refused_in_one_line(tmp_path, extra, file, key):
    env = {"environment.gpus": "gpus = 1", "environment.os": 'os = "windows"', "environment.network_mode": 'network_mode = "host"',
           "environment.env.TOKEN": ""}.get(key, "")
    d = harbor_task(tmp_path, extra=extra, env=env)
    if key == "environment.env.TOKEN":
        p = d / "task.toml"
        p.write_text(p.read_text().replace('env = { MODE = "test" }', 'env = { MODE = "test", TOKEN = "${API_TOKEN}" }'))
    msg = load_error(tmp_path)
    line = next(ln for ln in msg.splitlines() if key in ln)
    assert file in line and "hello" in line, msg
    assert "Traceback" not in msg


def test_compose_environment_is_refused_naming_the_file(tmp_path):
    d = harbor_task(tmp_path)
    (d / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    msg = load_error(tmp_path)
    assert "environment/docker-compose.yaml" in msg and "compose" in msg


def test_missing_test_sh_is_refused_unless_the_harness_table_grades(tmp_path):
    harbor_task(tmp_path, "a", test_sh=False)
    assert "tests/test.sh" in load_error(tmp_path)
    other = tmp_path / "other"
    harbor_task(other, "b", test_sh=False, extra=textwrap.dedent("""\
        [harness]
        allow = ["/app/out.txt"]
        [harness.state]
        kind = "files"
        paths = { "/app" = "environment" }
        [[harness.expect]]
        path = "/app/out.txt"
        contains = "hello"
        """))
    t = load_suite(str(other)).tasks[0]
    assert t.state_kind == "files" and t.grader_kind == "expectations"
    # the fixture path is the task's own directory, relative to the suite
    assert list(t.state.paths.values()) == ["b/environment"]


def test_unknown_harness_key_is_named(tmp_path):
    harbor_task(tmp_path, extra="[harness]\nservise = 1\n")
    assert "harness.servise" in load_error(tmp_path)


@pytest.mark.parametrize("table, wrong, right", [
    ("environment", "memroy_mb = 4096", "memory_mb"),
    ("agent", "timeout_secs = 30", "timeout_sec"),
    ("verifier", "timout_sec = 30", "timeout_sec"),
    ("", "artefacts = []", "artifacts"),
    ("harness", "servise = 1", "services"),
])
def test_misspelt_harbor_key_stops_the_suite_with_the_nearest_spelling(tmp_path, table, wrong, right):
    """Harbor ignores a key it does not know, which would run the task under the default
    envelope; here it is refused, even when the suite's other tasks are fine."""
    d = harbor_task(tmp_path, "typo", extra="[harness]\n" if table == "harness" else "")
    harbor_task(tmp_path, "fine")
    p = d / "task.toml"
    text = p.read_text()
    p.write_text(text.replace(f"[{table}]\n", f"[{table}]\n{wrong}\n", 1) if table else f"{wrong}\n{text}")
    msg = load_error(tmp_path)
    key = f"{table}.{wrong.split()[0]}" if table else wrong.split()[0]
    line = next(ln for ln in msg.splitlines() if key in ln)
    assert "typo/task.toml" in line and f"did you mean {right!r}" in line, msg
    assert "fine" not in msg and "Traceback" not in msg


def test_harbor_table_that_is_not_a_table_is_refused(tmp_path):
    d = harbor_task(tmp_path)
    p = d / "task.toml"
    p.write_text('agent = "fast"\n' + p.read_text().replace("[agent]\ntimeout_sec = 90.0\n", ""))
    assert "agent: expected a table" in load_error(tmp_path)


def tb_load_error(root, line):
    """The load error of a Terminal-Bench task whose task.yaml has one extra LINE."""
    d = root / "tb"
    d.mkdir()
    (d / "task.yaml").write_text(f"instruction: do it\n{line}\n")
    (d / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (d / "run-tests.sh").write_text("true\n")
    return load_error(root)


def test_misspelt_terminal_bench_key_is_refused(tmp_path):
    msg = tb_load_error(tmp_path, "max_agent_timout_sec: 5")
    assert "max_agent_timout_sec" in msg and "did you mean 'max_agent_timeout_sec'" in msg, msg


def test_misspelt_key_is_one_line_and_exit_2_from_the_cli(tmp_path):
    import os
    import subprocess
    import sys

    suite = tmp_path / "suite"
    d = harbor_task(suite)
    p = d / "task.toml"
    p.write_text(p.read_text().replace("[environment]\n", "[environment]\nmemroy_mb = 64\n"))
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    for argv in (["suites", "check", str(suite)], ["suites", "show", str(suite)],
                 ["run", "--suite", str(suite), "--agent", "oracle", "--db", f"sqlite:///{tmp_path}/h.db"]):
        r = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "environment.memroy_mb" in lines[0] and "did you mean 'memory_mb'" in lines[0], r.stderr
    assert not (tmp_path / "h.db").exists(), "nothing is stored for a suite that does not load"


def test_terminal_bench_task_yaml(tmp_path):
    d = tmp_path / "tb-hello"
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(textwrap.dedent("""\
        instruction: |
          Create /app/hello.txt containing "Hello, world!".
        author_name: someone
        difficulty: easy
        category: file-operations
        tags: [files]
        max_agent_timeout_sec: 240
        max_test_timeout_sec: 30
        """))
    (d / "Dockerfile").write_text("FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nWORKDIR /app\n")
    (d / "run-tests.sh").write_text("#!/bin/bash\nbash /tests/check.sh\n")
    (d / "tests" / "check.sh").write_text("#!/bin/bash\ntest -f /app/hello.txt\n")
    (d / "solution.sh").write_text("#!/bin/bash\necho 'Hello, world!' > /app/hello.txt\n")
    s = load_suite(str(tmp_path))
    assert s.format == "terminal-bench"
    t = s.tasks[0]
    assert t.id == "tb-hello" and t.prompt.startswith("Create /app/hello.txt")
    assert t.envelope.timeouts == {"agent": 240, "grade": 30}
    assert t.grader.kind == "verifier" and t.grader.reward == "exit"
    assert "run-tests.sh" in t.grader.extra and t.solution


def test_terminal_bench_compose_with_more_than_one_service_is_refused(tmp_path):
    d = tmp_path / "multi"
    d.mkdir()
    (d / "task.yaml").write_text("instruction: do it\n")
    (d / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (d / "run-tests.sh").write_text("true\n")
    (d / "docker-compose.yaml").write_text(textwrap.dedent("""\
        services:
          client:
            build: {context: .}
          server:
            image: redis:7
        """))
    msg = load_error(tmp_path)
    assert "docker-compose.yaml" in msg and "Traceback" not in msg


# -- the Dockerfile translator -------------------------------------------------------------

LOCAL = {"python:3.12-slim": "harness/python:bookworm", "ubuntu:24.04": "harness/debian:bookworm"}


def _resolve(ref: str) -> str:
    return LOCAL[ref.split("@")[0]]


def test_translator_maps_bases_and_passes_the_ca_to_every_stage():
    df = textwrap.dedent("""\
        # syntax=docker/dockerfile:1.4
        ARG BASE=python:3.12-slim
        FROM ${BASE}@sha256:0123 AS build
        RUN --mount=type=cache,target=/root/.cache pip install requests
        COPY --link --chmod=755 run.sh /usr/local/bin/run.sh
        FROM ubuntu:24.04
        COPY --from=build /usr/local/bin/run.sh /run.sh
        """)
    tr = translate(df, _resolve, b"-----BEGIN CERTIFICATE-----\n")
    lines = tr.text.splitlines()
    froms = [ln for ln in lines if ln.startswith("FROM")]
    assert froms == ["FROM harness/python:bookworm AS build", "FROM harness/debian:bookworm"]
    assert tr.bases == {"python:3.12-slim@sha256:0123": "harness/python:bookworm", "ubuntu:24.04": "harness/debian:bookworm"}
    # every stage trusts the host's CA for pip, requests, curl, git and apt
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "APT_CONFIG"):
        assert sum(ln.startswith(f"ARG {var}=") for ln in lines) == 2
    assert ".harness-build-ca.pem" in tr.files and tr.files[".harness-build-ca.pem"].startswith(b"-----BEGIN")
    assert "RUN pip install requests" in lines  # the cache mount dropped, the command kept
    assert "COPY run.sh /usr/local/bin/run.sh" in lines and "RUN chmod -R 755 /usr/local/bin/run.sh" in lines
    assert "COPY --from=build /usr/local/bin/run.sh /run.sh" in lines
    assert any("cache" in n for n in tr.notes) and any("--chmod" in n for n in tr.notes)
    assert not any("syntax=" in ln for ln in lines)


def test_translator_runs_heredocs_as_scripts():
    tr = translate("FROM ubuntu:24.04\nRUN <<EOT\nset -e\necho hi > /hello\nEOT\n", _resolve, None)
    run = [ln for ln in tr.text.splitlines() if ln.startswith("RUN")]
    assert len(run) == 1 and "base64 -d" in run[0]
    import base64
    import re
    body = base64.b64decode(re.search(r"echo (\S+) \| base64 -d", run[0]).group(1)).decode()
    assert body == "set -e\necho hi > /hello\n"


@pytest.mark.parametrize("line,word", [
    ("RUN --mount=type=secret,id=tok cat /run/secrets/tok", "secret"),
    ("RUN --mount=type=ssh git clone git@host:x", "ssh"),
])
def test_translator_refuses_what_needs_buildkit_naming_the_line(line, word):
    with pytest.raises(DockerfileError) as e:
        translate(f"FROM ubuntu:24.04\n{line}\n", _resolve, None)
    assert "line 2" in str(e.value) and word in str(e.value)


# -- the base map ------------------------------------------------------------------------

def test_base_map_order_user_then_suite_then_local_then_defaults():
    present = {"node:20": True}.get
    mine = {"my/python:local", "my/ubuntu:local"}.__contains__  # the mapped images the engine has
    bm = BaseMap.parse(["python:3.12-slim=my/python:local"], {"ubuntu:*": "my/ubuntu:local"})
    assert bm.resolve("python:3.12-slim", mine) == "my/python:local"
    assert bm.resolve("docker.io/library/python:3.12-slim@sha256:ab", mine) == "my/python:local"
    assert bm.resolve("ubuntu:22.04", mine) == "my/ubuntu:local"
    # a mapping to an image the engine does not have is refused by name (a build would ask a registry)
    for ref, where in (("python:3.12-slim", "--base-map python:3.12-slim=my/python:local"), ("ubuntu:22.04", "the suite's base_map: ubuntu:*=my/ubuntu:local")):
        with pytest.raises(DockerfileError) as e:
            bm.resolve(ref, lambda r: False)
        assert str(e.value).startswith(where) and "is not on this engine" in str(e.value), str(e.value)
    assert BaseMap.parse(["node:*=harness/debian:bookworm"]).resolve("node:20", lambda r: False) == "harness/debian:bookworm"  # the harness builds its own
    assert bm.resolve("node:20", lambda r: bool(present(r))) == "node:20"  # the engine has it: used as it is
    plain = BaseMap.parse(None)
    assert plain.resolve("python:3.11-slim-bookworm", lambda r: False) == "harness/python:bookworm"
    assert plain.resolve("debian:bookworm-slim", lambda r: False) == "harness/debian:bookworm"
    assert plain.resolve("ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest", lambda r: False) == "harness/debian:bookworm"
    with pytest.raises(DockerfileError) as e:
        plain.resolve("node:20", lambda r: False)
    assert "--base-map" in str(e.value) and "node:20" in str(e.value)
    with pytest.raises(ValueError):
        BaseMap.parse(["python:3.12-slim"])


# -- what a verifier installs at test time, fetched at build time ---------------------------

def test_verifier_requirements_from_common_test_scripts():
    from harness.sandbox.prewarm import verifier_requirements

    uvx = textwrap.dedent("""\
        apt-get update
        apt-get install -y curl
        curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
        source $HOME/.local/bin/env
        uvx \\
          -p 3.13 \\
          -w pytest==8.4.1 \\
          -w pytest-json-ctrf==0.3.5 \\
          pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA -p no:cacheprovider
        """)
    assert verifier_requirements(uvx) == ["pytest==8.4.1", "pytest-json-ctrf==0.3.5", "pytest"]
    venv = textwrap.dedent("""\
        uv venv .tbench-testing > /dev/null 2>&1
        source .tbench-testing/bin/activate
        uv pip install pytest==8.4.1 'requests>=2,<3' -r /tests/requirements.txt > /dev/null 2>&1
        python3 -m pip install --index-url https://example.invalid/simple $EXTRA ./local.whl numpy
        uv run --with pandas==2.2.3 pytest /tests
        """)
    files = {"/tests/requirements.txt": "httpx==0.27.0  # pinned\n\n"}
    assert verifier_requirements(venv, files.get) == ["pytest==8.4.1", "requests>=2,<3", "httpx==0.27.0", "numpy", "pandas==2.2.3"]
    assert verifier_requirements("#!/bin/bash\npython3 /tests/check.py\n") == []


def test_suites_check_reports_tasks_no_agent_can_run_as_broken_rows():
    from harness.engine.check import check_suite
    from harness.model.errors import NothingToRun

    def oracle_cannot_start(agent: str):
        raise NothingToRun("no task can run here", {"a": "task a has no solution", "b": "task b has no solution"})

    checks, runs = check_suite(oracle_cannot_start, ["a", "b"])
    assert runs == [] and [c.task for c in checks] == ["a", "b"]
    assert all(not c.ok and c.oracle == "not run" and "has no solution" in c.reasons[0] for c in checks)


def test_suites_check_calls_a_task_unmeasured_by_the_host_unmeasured_not_broken():
    """Every attempt discarded for the host says nothing of the task: no verdict (exit 3 in the
    CLI); discarded for an envelope rule (its own envelope too small) is the task's: broken."""
    from harness.engine.check import check_suite
    from harness.model.attempt import AttemptRecord
    from harness.model.run import RunRecord

    run = RunRecord(id="r", suite="s", suite_hash="h", image="i", image_digest="d", agent_cmd=["x"], profile="p",
                    profile_json={}, harness_version="0", host={}, cgroup_version="2", trials=1, ks=[1], max_reruns=1,
                    task_ids=["host", "env", "fine"])

    def att(task: str, no: int, **kw) -> AttemptRecord:
        return AttemptRecord(run_id="r", task_id=task, slot=0, attempt_no=no, seed=0, **kw)

    def run_one(agent: str):
        out = [att("host", n, verdict="discarded", reasons=["host_cpu_contention"]) for n in (1, 2)]
        out += [att("env", n, verdict="discarded", reasons=["cpu_throttled"]) for n in (1, 2)]
        ok = "pass" if agent == "oracle" else "fail"
        out.append(att("fine", 1, verdict="clean", outcome=ok, failure_kind=None if ok == "pass" else "wrong_state"))
        return run, out

    checks = {c.task: c for c in check_suite(run_one, ["host", "env", "fine"])[0]}
    assert checks["fine"].verdict == "ok"
    assert checks["env"].verdict == "broken" and "cpu_throttled" in checks["env"].reasons[0]
    host = checks["host"]
    assert host.verdict == "unmeasured" and not host.reasons and not host.ok
    assert "host_cpu_contention x2" in host.unmeasured[0] and len(host.unmeasured) == 2  # oracle and nop


@pytest.mark.parametrize("edit", ['metadata = "x"', "artifacts = 5", "[environment]\nbuild_timeout_sec = \"abc\"",
                                  "[environment]\ncpus = inf", "[environment]\nallow_internet = \"false\""])
def test_a_value_of_the_wrong_type_is_one_line_not_a_traceback(tmp_path, edit):
    d = harbor_task(tmp_path)
    p = d / "task.toml"
    text = p.read_text()
    key, _, value = edit.rpartition("\n")[2].partition(" = ")
    table = edit.split("\n")[0] if "\n" in edit else ""
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
    if table:
        lines.insert(lines.index(table) + 1, f"{key} = {value}")
    else:
        lines.insert(1, f"{key} = {value}")
    p.write_text("\n".join(lines) + "\n")
    msg = load_error(tmp_path)
    assert "task.toml" in msg and "Traceback" not in msg, msg


@pytest.mark.parametrize("table, key", [("agent", "agent.timeout_sec"), ("verifier", "verifier.timeout_sec")])
@pytest.mark.parametrize("value", ['"x"', "true", "0", "-5", "inf"])
def test_a_time_limit_that_is_not_seconds_names_its_own_key(tmp_path, table, key, value):
    """``true`` would be read as 1 s and ``inf`` as no limit: both are refused, under the key
    the author wrote (the verifier's, not the agent's)."""
    d = harbor_task(tmp_path)
    p = d / "task.toml"
    old = "timeout_sec = 90.0" if table == "agent" else "timeout_sec = 45.0"
    p.write_text(p.read_text().replace(old, f"timeout_sec = {value}"))
    msg = load_error(tmp_path)
    assert key in msg and "not a positive number of seconds" in msg, msg
    other = "verifier.timeout_sec" if table == "agent" else "agent.timeout_sec"
    assert other not in msg, msg


def test_terminal_bench_time_limit_true_is_not_one_second(tmp_path):
    msg = tb_load_error(tmp_path, "max_agent_timeout_sec: true")
    assert "max_agent_timeout_sec" in msg and "not a positive number of seconds" in msg, msg


def test_an_unknown_key_is_shown_as_one_printable_line(tmp_path):
    """A key is the author's text: a newline or a bidi override in it never reaches the terminal."""
    d = harbor_task(tmp_path)
    p = d / "task.toml"
    p.write_text('"evil\\nkey\\u202e\\u001b[31m" = 1\n' + p.read_text())
    msg = load_error(tmp_path)
    line = next(ln for ln in msg.splitlines() if "evil" in ln)
    assert "\x1b" not in msg and "\u202e" not in msg and "unknown key" in line, msg


def test_a_misspelt_key_is_named_before_what_it_made_fail():
    """`trails = 3` leaves trials at the dataset's default of 1, which k = 3 then exceeds:
    the misspelling is the first line, the consequence after it."""
    from pydantic import ValidationError

    from harness.model.suite import SuiteSpec
    from harness.model.units import format_validation_error

    with pytest.raises(ValidationError) as e:
        SuiteSpec.model_validate({"name": "x", "trials": 1, "k": [1, 3], "state": "container", "dockerfile": None, "trails": 3, "format": "harbor"})
    lines = format_validation_error("harness.toml", e.value, SuiteSpec).splitlines()
    assert lines[0] == "harness.toml: trails: unknown key (did you mean 'trials'?)", lines
    assert len(lines) == 2 and "exceeds trials = 1" in lines[1], lines


def test_a_reward_value_past_any_float_is_no_number_never_a_crash():
    # a verifier may copy the agent's answer into reward.json; 400 digits raised OverflowError
    # in the controller, and the attempt became an infrastructure discard the agent had chosen
    from harness.state.verifier import parse_reward

    reward, values, why = parse_reward(b'{"reward": 0, "answer": 1' + b"0" * 400 + b"}", None)
    assert reward is None and values == {} and why == "reward.json: 'answer' is not a finite number"
