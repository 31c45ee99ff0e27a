"""Bad input through the CLI: one clear line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PROBE = HERE / "suites" / "probe"
BROKEN = HERE / "fixtures" / "suites" / "broken"


def harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def assert_usage_error(r: subprocess.CompletedProcess, tmp_path: Path, *needles: str, lines: int | None = 1) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err_lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if lines is not None:
        assert len(err_lines) == lines, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert not (tmp_path / "h.db").exists(), "nothing may be written to the store"
    assert not (tmp_path / "home").exists(), "no artifacts folder either"


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/h.db"


def copy_probe(tmp_path: Path) -> Path:
    d = tmp_path / "suite"
    shutil.copytree(PROBE, d)
    return d


def test_unknown_suite(tmp_path):
    r = harness(tmp_path, "run", "--suite", "no-such-suite", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "no-such-suite")
    assert "did you mean" not in r.stderr
    r = harness(tmp_path, "run", "--suite", "refund", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "unknown suite 'refund' (did you mean 'refunds'?)")


def test_broken_suite_names_file_and_key(tmp_path):
    r = harness(tmp_path, "run", "--suite", str(BROKEN), "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "suite.toml", lines=None)


@pytest.mark.parametrize(
    "old, new, needles",
    [
        ('trials = 3', 'trials = 3\ncolour = "red"', ["suite.toml", "colour", "unknown key"]),
        ('trials = 3', 'trials = "three"', ["suite.toml", "trials"]),
        ('k = [1, 2, 3]', 'k = [1, 2, 9]', ["suite.toml", "k", "exceeds trials"]),
        ('state_sql = ["schema.sql"]', 'state_sql = ["missing.sql"]', ["suite.toml", "state_sql", "missing.sql"]),
    ],
)
def test_bad_suite_file_fields(tmp_path, old, new, needles):
    d = copy_probe(tmp_path)
    f = d / "suite.toml"
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new, 1))
    r = harness(tmp_path, "run", "--suite", str(d), "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, *needles)


def test_bad_task_file_names_file_and_key(tmp_path):
    d = copy_probe(tmp_path)
    f = d / "tasks" / "append.toml"
    f.write_text(f.read_text().replace('rows = [[0]]', 'rows = [[0]]\ncount = 1'))
    r = harness(tmp_path, "run", "--suite", str(d), "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "append.toml", "expect")


def test_k_above_trials_on_the_command_line(tmp_path):
    r = harness(tmp_path, "run", "--suite", str(PROBE), "--trials", "2", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "k = 3", "exceeds 2 trials", "--k")


def test_unknown_profile(tmp_path):
    r = harness(tmp_path, "run", "--suite", str(PROBE), "--profile", "huge", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "unknown profile 'huge'", "standard")


@pytest.mark.parametrize(
    "body, needles",
    [
        ("cpus = 4\ncores = 1\n", ["cpus = 4.0 exceeds cores = 1"]),
        ("memory = '4m'\n", ["memory", "below the floor"]),
        # the core count is checked against the engine's host, so this case needs the engine
        pytest.param("cores = 64\ncpus = 1\n", ["needs 64 exclusive cores"], marks=pytest.mark.docker),
    ],
)
def test_impossible_envelopes(tmp_path, body, needles):
    prof = tmp_path / "p.toml"
    prof.write_text(body)
    r = harness(tmp_path, "run", "--suite", str(PROBE), "--profile", str(prof), "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, *needles, lines=None)


def test_cpuset_out_of_range(tmp_path):
    r = harness(tmp_path, "sandbox", "exec", "--cpuset", "99", "--", "true")
    assert r.returncode == 2 and "cores [99] do not exist" in r.stderr, r.stderr


def test_unknown_task(tmp_path):
    r = harness(tmp_path, "run", "--suite", str(PROBE), "--tasks", "append,nope", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "no task nope")
    r = harness(tmp_path, "run", "--suite", "refunds", "--tasks", "duplicate-charg", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "no task duplicate-charg (did you mean 'duplicate-charge'?)")


def test_missing_image_names_the_command_that_builds_it(tmp_path, docker_client):
    # a suite of one's own is built from its directory: `images build` alone builds the built-in suites
    d = copy_probe(tmp_path)
    f = d / "suite.toml"
    f.write_text(f.read_text().replace('image = "harness/sandbox:latest"', 'image = "harness/does-not-exist:latest"'))
    r = harness(tmp_path, "run", "--suite", str(d), "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "harness/does-not-exist:latest", f"build it with `harness images build --suite {d}`")


@pytest.mark.parametrize("cmd", [["report", "r-nope"], ["trials", "r-nope"], ["gate", "r-nope", "--require", "pass@1>=0.5"], ["show", "99999"], ["samples", "r-nope"]])
def test_unknown_run_or_attempt_ids(tmp_path, cmd):
    from harness.store.store import Store

    Store.open(db(tmp_path))  # an empty store exists
    r = harness(tmp_path, *cmd, "--db", db(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_reading_a_store_that_does_not_exist(tmp_path):
    r = harness(tmp_path, "runs")  # the default store before the first run: listing nothing is an answer
    assert r.returncode == 0 and "no runs yet" in r.stdout, r.stderr
    # a database named with --db that does not exist is a mistyped path, not an empty store
    r = harness(tmp_path, "runs", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, f"no harness database at {tmp_path}/h.db")
    assert "no runs yet" not in r.stdout
    r = harness(tmp_path, "runs", "--db", "sqlite:///some/mistyped/path.db")
    assert_usage_error(r, tmp_path, "no harness database at some/mistyped/path.db")
    r = harness(tmp_path, "report", "last", "--db", db(tmp_path))  # asking for a run that cannot exist is not either
    assert_usage_error(r, tmp_path, "no harness database")


def test_resume_with_identity_options_is_refused(tmp_path):
    r = harness(tmp_path, "run", "--resume", "last", "--trials", "3", "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "--resume keeps the run's identity", "--trials")
    r = harness(tmp_path, "run", "--resume", "last", "--seed", "5", "--db", db(tmp_path))  # was taken and ignored
    assert_usage_error(r, tmp_path, "--resume keeps the run's identity", "--seed")
    r = harness(tmp_path, "run", "--resume", "last", "--note", "again", "--db", db(tmp_path))  # was dropped
    assert_usage_error(r, tmp_path, "--resume keeps the run's identity", "--note")


@pytest.mark.parametrize("args,says", [(["--tasks", ",,"], "names no task"), (["--tasks", " "], "names no task"),
                                       (["--agent-cmd", ""], "--agent-cmd is empty")])
def test_an_empty_list_is_refused_never_read_as_all(tmp_path, args, says):
    # a CI variable that expanded to nothing ran the whole suite, or the suite's own agent
    r = harness(tmp_path, "run", "--suite", "refunds", *args, "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, says)


def test_image_built_from_older_suite_files_is_refused(tmp_path, docker_client):
    d = copy_probe(tmp_path)
    f = d / "suite.toml"
    f.write_text(f.read_text().replace('image = "harness/sandbox:latest"', 'image = "harness/test-stale-probe:latest"'))
    b = harness(tmp_path, "images", "build", "--suite", str(d))
    assert b.returncode == 0, b.stderr
    try:
        ok = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert ok.returncode == 0, ok.stderr
        (tmp_path / "h.db").unlink()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
        # tasks and fixtures reach a trial at run time, not through the image: editing them
        # never makes the image stale (it used to)
        (d / "schema.sql").write_text((d / "schema.sql").read_text() + "\n-- edited after the image was built\n")
        t = d / "tasks" / "append.toml"
        t.write_text(t.read_text().replace('title = "', 'title = "edited: '))
        ok = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert ok.returncode == 0, ok.stderr
        (tmp_path / "h.db").unlink()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
        # a file the image is built from does make it stale
        original = (d / "Dockerfile").read_text()
        (d / "Dockerfile").write_text(original + "\n# edited after the image was built\n")
        r = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert_usage_error(r, tmp_path, "harness/test-stale-probe:latest", "harness images build --suite")
        # a copy of the suite under another name on the first one's image: refused while its
        # files are not what the image was built from (it ran, silently, on the old image)
        f.write_text(f.read_text().replace('name = "probe"', 'name = "probe-copy"'))
        r = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert_usage_error(r, tmp_path, "built from suite 'probe'", "not from suite probe-copy", "harness images build --suite")
        (d / "Dockerfile").write_text(original)  # the same files: the image is what they build
        ok = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert ok.returncode == 0, ok.stderr
        (tmp_path / "h.db").unlink()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
        # harness's own image tagged with the suite's image name
        docker_client.images.get("harness/sandbox:latest").tag("harness/test-stale-probe", "latest")
        r = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert_usage_error(r, tmp_path, "not built from suite probe-copy", "one of harness's own images")
        # built FROM harness's image by something else (a `docker build` of one's own): it carries
        # the parent's inputs label, so what it holds is unknown
        import io
        docker_client.images.build(fileobj=io.BytesIO(b"FROM harness/sandbox:latest\nENV BUILT_BY=hand\n"),
                                   tag="harness/test-stale-probe:latest", pull=False, rm=True)
        r = harness(tmp_path, "run", "--suite", str(d), "--tasks", "append", "--trials", "1", "--k", "1", "--db", db(tmp_path))
        assert_usage_error(r, tmp_path, "built FROM harness/sandbox:latest by something else than `harness images build`",
                           "harness images build --suite")
    finally:
        docker_client.images.remove("harness/test-stale-probe:latest", force=True)


def test_repeated_task_ids_run_once(tmp_path, docker_client):
    import json

    r = harness(tmp_path, "run", "--suite", str(PROBE), "--tasks", "append,append", "--trials", "1", "--k", "1", "--db", db(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    assert [t["task"] for t in json.loads(r.stdout)["tasks"]] == ["append"]


def test_an_agent_command_missing_from_the_image_is_refused_before_the_run(tmp_path, docker_client):
    """Decided by a probe the harness runs in the image, never by what an agent prints: an
    agent that exits 127 in a hurry is graded like any other (see test_run_docker)."""
    r = harness(tmp_path, "run", "--suite", str(PROBE), "--trials", "1", "--k", "1", "--agent-cmd", "no-such-agent --flag",
                "--db", db(tmp_path))
    assert_usage_error(r, tmp_path, "'no-such-agent' is not an executable file on the PATH of image harness/sandbox:latest",
                       "--agent-cmd")


def test_sandbox_exec_of_an_image_not_here_is_a_usage_error(tmp_path, docker_client):
    """No registry is asked (this machine has none): the image is looked up on the engine."""
    r = harness(tmp_path, "sandbox", "exec", "--image", "nosuch/img:1", "--", "true")
    assert_usage_error(r, tmp_path, "--image nosuch/img:1: image nosuch/img:1 not found on this engine", "build or load it")
    assert "registry" not in r.stderr.replace("no registry is used", "")


@pytest.mark.parametrize("args,needles", [
    (["run", "--trials", "x"], ["error:", "'--trials'", "harness run --help`"]),
    (["run", "--no-such-option"], ["No such option: --no-such-option", "harness run --help`"]),
    (["reprot"], ["No such command 'reprot' (did you mean 'report'?)", "harness --help`"]),
    (["diff", "a", "b"], ["No such command 'diff' (did you mean `", "harness compare`?)"]),
    (["run", "--suite", "refunds", "--k", "1,,2"], ["--k '1,,2': an empty value between commas"]),
    (["run", "--suite", "refunds", "--k", "1,two"], ["--k '1,two': expected integers like 1,2,4"]),
    (["sandbox", "exec", "--timeout", "0", "--", "true"], ["--timeout 0: seconds of wall clock, finite and more than 0"]),
    (["sandbox", "exec", "--timeout", "-1", "--", "true"], ["--timeout -1: seconds of wall clock, finite and more than 0"]),
    (["run", "--suite", "refunds", "--profile", "tigth"], ["unknown profile 'tigth' (did you mean 'tight'?)"]),
    (["gate"], ["Missing argument", "harness gate --help`"]),
    (["report", "--format", "xml"], ["'xml' is not one of", "harness report --help`"]),
])
def test_a_command_line_that_does_not_parse_is_one_line(tmp_path, args, needles):
    r = harness(tmp_path, *args)
    assert_usage_error(r, tmp_path, *needles)
    assert r.stderr.startswith("error: ") and "╭" not in r.stderr and not r.stdout


def test_an_internal_error_exits_3_never_1(tmp_path):
    """A bug (here a fake one: a command that raises ZeroDivisionError) is not a gate that
    failed: exit 3 with the traceback and one line saying what it is."""
    code = ("import harness.cli as cli, harness.cli.commands as c\n"
            "def fake_bug(): 1 / 0\n"
            "c.start = fake_bug\n"
            "cli.main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "HARNESS_HOME": str(tmp_path / "home")})
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "ZeroDivisionError" in r.stderr and r.stderr.rstrip().splitlines()[-1].startswith("error: internal error in harness")


def test_an_empty_run_id_is_refused_as_such(tmp_path):
    from harness.store.store import Store

    url = f"sqlite:///{tmp_path / 'h.db'}"
    Store.open(url)  # an empty store: the message must not be "ambiguous prefix" (every id starts with '')
    for args in (["report", ""], ["run", "--resume", " "], ["gate", "", "--require", "pass@1>=0.5"]):
        r = harness(tmp_path, *args, "--db", url)
        assert r.returncode == 2 and "empty run id" in r.stderr and "ambiguous" not in r.stderr, (args, r.stderr)


def test_help_prose_is_reflowed_and_examples_keep_their_lines():
    from harness.cli.app import reflow_help

    doc = ("Run a suite.\n\nEach attempt is judged; discarded ones are\nrerun and kept as evidence.\n\n"
           "Rules:\n- one item that goes\n  on a second line\n- another\n\nExamples:\n\n  harness run --suite refunds\n\n"
           "  harness run --resume last\n")
    assert reflow_help(doc) == ("Run a suite.\n\nEach attempt is judged; discarded ones are rerun and kept as evidence.\n\n"
                                "Rules:\n- one item that goes on a second line\n- another\n\nExamples:\n\n  harness run --suite refunds\n\n"
                                "  harness run --resume last")


def test_help_at_80_columns_has_no_line_broken_by_the_source(tmp_path):
    # the docstrings' own line breaks used to survive, so at 80 columns a long source line wrapped
    # into a full line and a stub of a word or two ("and kept", "stored.")
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--help"], capture_output=True, text=True, env=env, timeout=60)
    prose = r.stdout.split("Examples:")[0].splitlines()
    stubs = [ln for ln in prose if 0 < len(ln.strip()) <= 12 and not ln.strip().startswith(("Usage", "harness"))]
    assert not stubs, stubs


@pytest.mark.parametrize("command", [["run"], ["report"], ["compare"], ["export"], ["sandbox", "exec"], ["gate"]])
def test_help_at_80_columns_cuts_no_word_with_an_ellipsis(command):
    # a URL or NAME=value example wider than the help column was cut ("openai=https://api.ope…"):
    # it folds onto the next line, whole
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "harness", *command, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "Usage" in r.stdout, r.stderr[-500:]
    assert "…" not in r.stdout, [ln for ln in r.stdout.splitlines() if "…" in ln]


def _all_commands() -> list[list[str]]:
    import typer

    from harness.cli.commands import app

    out: list[list[str]] = []

    def walk(group, path):
        for name, cmd in sorted(getattr(group, "commands", {}).items()):
            if getattr(cmd, "hidden", False):
                continue
            out.append([*path, name])
            walk(cmd, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_every_help_example_fits_80_columns_and_pastes_whole():
    # an example wrapped at 80 columns pastes as two broken commands ("--tasks" on one line,
    # its value on the next): every example of every command fits on its line
    env = {**os.environ, "COLUMNS": "80"}
    broken = []
    for command in _all_commands():
        r = subprocess.run([sys.executable, "-m", "harness", *command, "--help"], capture_output=True, text=True, env=env, timeout=60)
        lines = r.stdout.splitlines()
        for i, ln in enumerate(lines[:-1]):
            if ln.lstrip().startswith("harness ") and lines[i + 1].strip() and not lines[i + 1].lstrip().startswith(("harness ", "#")):
                broken.append(f"{' '.join(command)}: {ln.strip()} / {lines[i + 1].strip()}")
    assert not broken, "\n".join(broken)
