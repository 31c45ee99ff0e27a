"""Grader ``verifier``: a command run after the agent, as Harbor runs ``tests/test.sh``.

The tests reach ``/tests`` only once every agent process is gone (the agent never sees
them); ``/logs/verifier`` is emptied right before the command, so a reward the agent wrote
there counts for nothing; the command runs under the grade envelope and timeout, from the
task's working directory; whatever it leaves running is killed before anything is read.
``shared`` runs it in the agent's own sandbox (Harbor's default: it sees everything the
agent changed -- and everything the agent could have tampered with); ``separate`` in a fresh
sandbox from the task image, with only the exported state copied in.

The reward is ``/logs/verifier/reward.json`` (a flat JSON object of numbers: its ``reward``
key, or its only value) or else ``reward.txt`` (one number), read size-capped; pass =
reward >= the task's threshold. With ``reward = "exit"`` (Terminal-Bench's run-tests.sh) the
reward is 1 when the command exits 0. A CTRF report (``ctrf.json``) becomes per-test
checks; the verifier's output and its whole ``/logs/verifier`` are kept with the attempt.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.model.grade import Check, GradeResult
from harness.model.sandbox import LOGS_DIR, TESTS_DIR, ExecResult, ExportFile
from harness.model.state import VerifierGraderSpec
from harness.model.suite import Suite, Task
from harness.state.base import GradePlan, Grader, StateKind
from harness.state.expectations import killed, last_line

VERIFIER_DIR = f"{LOGS_DIR}/verifier"
REWARD_TXT, REWARD_JSON, CTRF = "reward.txt", "reward.json", "ctrf.json"
READS = {REWARD_TXT: 4096, REWARD_JSON: 64 * 1024, CTRF: 1024 * 1024}
LOGS_CAP = 16 * 1024 * 1024
MAX_TEST_CHECKS = 50


# Terminal-Bench's run-tests.sh sources helpers its own harness copies into $TEST_DIR; a task
# directory does not ship them. These are the harness's own equivalents (uv is preinstalled
# in the local bases, pytest prefetched at the task's build).
TB_HELPERS = {
    "setup-uv-pytest.sh": (
        "# harness: a virtual environment with pytest for Terminal-Bench's run-tests.sh\n"
        "if ! command -v uv >/dev/null 2>&1; then curl -LsSf https://astral.sh/uv/install.sh | sh; source \"$HOME/.local/bin/env\"; fi\n"
        "uv venv .tbench-testing >/dev/null 2>&1 || true\n"
        "source .tbench-testing/bin/activate\n"
        "uv pip install pytest==8.4.1\n"),
    "run-uv-pytest.sh": (
        "# harness: Terminal-Bench's test run\n"
        "uv run pytest \"$TEST_DIR/test_outputs.py\" -rA\n"),
}


def tb_helpers(scripts: list[bytes | None], present: set[str]) -> dict[str, str]:
    """The helpers the scripts name that the task does not ship."""
    text = b"\n".join(s for s in scripts if s)
    return {n: body for n, body in TB_HELPERS.items() if n not in present and n.encode() in text}


def _spec(task: Task) -> VerifierGraderSpec:
    assert isinstance(task.grader, VerifierGraderSpec)
    return task.grader


class VerifierGrader(Grader):
    """A verifier command and its reward (see the module docstring)."""

    name = "verifier"

    def check_task(self, files: Any, src: str, task: Task, problems: list[str]) -> bool:
        g = _spec(task)
        if not all([files.check(rel, src, f"grader.extra.{name}", problems) for name, rel in g.extra.items()]):
            return False
        if g.tests is None:
            return True
        if not files.check(g.tests, src, "grader.tests", problems, "directory"):
            return False
        for arg in g.command:
            if arg.startswith(TESTS_DIR + "/"):
                rel = arg[len(TESTS_DIR) + 1:]
                if not files.has(f"{g.tests.rstrip('/')}/{rel}") and rel not in g.extra:
                    problems.append(f"{src}: grader.command: {arg} is not in {files.display(g.tests)}")
                    return False
        return True

    def runtime_files(self, spec: Any, task: Task) -> list[str]:
        g = _spec(task)
        return ([g.tests] if g.tests else []) + list(g.extra.values())

    def plan(self, suite: Suite, task: Task, kind: StateKind) -> GradePlan:
        g = _spec(task)
        tests = suite.files_under(g.tests) if g.tests else {}
        for name, rel in g.extra.items():
            data = suite.file_bytes(rel)
            if data is not None:
                tests[name] = (data, 0o755)
        for name, body in tb_helpers([tests.get(n, (None, 0))[0] for n in tests if n.endswith(".sh")], set(tests)).items():
            tests[name] = (body.encode(), 0o755)
        env = {"TEST_DIR": TESTS_DIR, **g.env}
        if g.mode == "separate" or (g.user and g.user != task.sandbox.user):
            # a verifier apart from the agent, or with more rights than it: Python must not import
            # what the agent left in the working directory (`python -m pytest` puts it first on
            # sys.path); the tests' own directory stays importable
            env["PYTHONSAFEPATH"] = "1"
            env["PYTHONPATH"] = TESTS_DIR + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
        return GradePlan(
            cmd=list(g.command), site="sandbox" if g.mode == "shared" else "separate", output="reward",
            tests=tests, env=env, user=g.user or task.sandbox.user,
            # never an agent-writable /tmp: `python -m pytest` puts its cwd first on sys.path
            workdir=task.sandbox.workdir or (TESTS_DIR if tests else "/"), reset=[VERIFIER_DIR],
            reads=[ExportFile(name, cap, path=f"{VERIFIER_DIR}/{name}") for name, cap in READS.items()],
            evidence=[ExportFile("verifier-logs", LOGS_CAP, path=VERIFIER_DIR, tree=True),
                      # whatever the agent had put in /logs/verifier (a forged reward is evidence too)
                      ExportFile("verifier-dir-before-grading", LOGS_CAP, path=f"{VERIFIER_DIR}.before-grading", tree=True)],
            image=g.image, carry=kind.carry(suite, task) if g.mode == "separate" else [],
        )

    def read(self, task: Task, result: ExecResult, oom_killed: bool, timeout_s: float, read_back: dict[str, bytes]) -> GradeResult:
        g = _spec(task)
        wall = result.wall_s
        stopped = killed(result, oom_killed, timeout_s)
        if stopped is not None:
            what = "the verifier was OOM-killed (the grade envelope's memory)" if oom_killed else \
                f"the verifier was killed at the grade timeout ({timeout_s:g} s)"
            return stopped.model_copy(update={"reason": what + _tail(result)})
        if result.exit_code is None:
            return GradeResult(status="broken", wall_s=wall, reason=f"the verifier could not be run: {last_line(result.stderr)}")
        if result.exit_code in (126, 127) and g.reward == "file" and not read_back.get(REWARD_TXT) and not read_back.get(REWARD_JSON):
            return GradeResult(status="broken", wall_s=wall, reason=f"the verifier could not start (exit {result.exit_code}): "
                               f"{' '.join(g.command)}: {last_line(result.stderr or result.stdout) or 'command not found'}")
        tests = ctrf_checks(read_back.get(CTRF))
        if g.reward == "exit":
            reward, rewards, why = (1.0 if result.exit_code == 0 else 0.0), {}, None
        else:
            reward, rewards, why = parse_reward(read_back.get(REWARD_JSON), read_back.get(REWARD_TXT))
        if reward is None:
            return GradeResult(status="ungradable", wall_s=wall, reason=f"{why} (exit {result.exit_code}){_tail(result)}",
                               checks=[Check(name="reward", kind="reward", passed=False, detail=why[:600] if why else None)] + tests)
        passed = reward >= g.threshold
        failed = [c for c in tests if not c.passed]
        detail = None if passed else (f"reward {reward:g} < threshold {g.threshold:g}"
                                      + (f": {len(failed)} of {len(tests)} tests failed ({', '.join(c.name for c in failed[:3])})"
                                         if failed else _tail(result)))
        checks = [Check(name="reward", kind="reward", passed=passed, detail=detail[:600] if detail else None)] + tests
        return GradeResult(status="graded", passed=passed, reason=detail, wall_s=wall, reward=reward, rewards=rewards, checks=checks)


def _tail(result: ExecResult) -> str:
    line = last_line(result.stdout) or last_line(result.stderr)
    return f"; its output ends: {line[:200]}" if line else ""


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer past any float (a verifier may copy an agent's answer here)
        return None
    return f if math.isfinite(f) else None


def parse_reward(raw_json: bytes | None, raw_txt: bytes | None) -> tuple[float | None, dict[str, float], str | None]:
    """(reward, every value of reward.json, why there is none). reward.json wins when present."""
    if raw_json is not None:
        try:
            doc = json.loads(raw_json.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None, {}, "reward.json is not valid JSON"
        if not isinstance(doc, dict) or not doc:
            return None, {}, "reward.json is not a flat JSON object of numbers"
        values = {str(k)[:100]: _number(v) for k, v in list(doc.items())[:100]}
        if any(v is None for v in values.values()):
            bad = next(k for k, v in values.items() if v is None)
            return None, {}, f"reward.json: {bad!r} is not a finite number"
        rewards = {k: float(v) for k, v in values.items() if v is not None}
        if "reward" in rewards:
            return rewards["reward"], rewards, None
        if len(rewards) == 1:
            return next(iter(rewards.values())), rewards, None
        return None, rewards, "reward.json has several values and no 'reward' key"
    if raw_txt is not None:
        text = raw_txt.decode("utf-8", errors="replace").strip()
        try:
            value = float(text.split()[0]) if text else None
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or len(text.split()) != 1:
            return None, {}, f"reward.txt is not one number ({text[:40]!r})"
        return value, {}, None
    return None, {}, f"the verifier wrote no reward ({VERIFIER_DIR}/{REWARD_TXT} or {REWARD_JSON})"


def ctrf_checks(raw: bytes | None) -> list[Check]:
    """Per-test checks from a CTRF report (failed first, at most 50); [] when absent or malformed."""
    if not raw:
        return []
    try:
        doc = json.loads(raw.decode("utf-8"))
        tests = doc["results"]["tests"]
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        return []
    if not isinstance(tests, list):
        return []
    out = []
    for t in tests[:2000]:
        if not isinstance(t, dict):
            continue
        status = str(t.get("status", ""))
        if status in ("skipped", "pending", "other"):
            continue
        msg = t.get("message") or t.get("trace")
        out.append(Check(name=_clean(str(t.get("name", "?")), 300), kind="test", passed=status == "passed",
                         detail=None if status == "passed" else _clean(str(msg or status), 600)))
    out.sort(key=lambda c: c.passed)
    return out[:MAX_TEST_CHECKS]


def _clean(s: str, limit: int) -> str:
    s = " ".join("".join(ch if ch.isprintable() else " " for ch in s).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
