"""Harbor and Terminal-Bench task directories, as they are, as suites.

``harness run --suite DIR``: DIR is one task (a ``task.toml`` -- Harbor -- or a ``task.yaml``
-- the older Terminal-Bench layout) or a directory of them (found up to three levels down).
Each task becomes a :class:`~harness.model.suite.Task` with its own image (built per task
from its Dockerfile, offline: ``harness.engine.taskimages``), a writable root, the state kind
``container`` and the ``verifier`` grader. An optional ``harness.toml`` beside the tasks
names the suite and its defaults (agent, trials, k, profile, base map) with the keys of
``suite.toml``; a task's own ``[harness]`` table may add what Harbor has no words for
(services, expectations).

Field mapping (README "Harbor tasks" has the table):

=================================  =====================================================
Harbor ``task.toml``               harness
=================================  =====================================================
instruction.md                     the prompt
[agent] timeout_sec / user         timeouts.agent / the agent's user (default: the image's)
[verifier] timeout_sec / env/user  timeouts.grade / the verifier's environment and user
                                   (default: the image's user, as Harbor)
[verifier] environment_mode        grader.mode (shared | separate; tests/Dockerfile builds
                                   a separate verifier's image)
[environment] cpus / memory(_mb)   cpus (cores = ceil(cpus)) / memory; Harbor's defaults
                                   (1 cpu, 2048 MB, 10240 MB storage) when absent
[environment] storage(_mb)         storage (writable root; enforced where the engine can)
[environment] allow_internet,      network: bridge when internet is allowed, else none
  network_mode ("none", "no-network")
[environment] env / workdir        the agent's environment / working directory
[environment] docker_image         a prebuilt image (mapped like a FROM)
[environment] build_timeout_sec    the build's time limit
artifacts                          kept as evidence; copied to a separate verifier
tests/test.sh, /logs/verifier/     the verifier; reward.json, else reward.txt
solution/solve.sh                  what ``--agent oracle`` runs (``bash /solution/solve.sh``)
=================================  =====================================================

Refused, with the file and the key: multi-step tasks (``[[steps]]``), compose environments
(``environment/docker-compose.yaml``, or a Terminal-Bench compose file with more than one
service), Windows tasks, GPUs/TPUs, MCP servers, secret references (``${NAME}`` values).
A key the format does not define (:data:`HARBOR_KEYS`, :data:`TB_KEYS`) stops the whole suite
with the nearest known spelling: it is the author's typo, not a task to leave out.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.engine.suites import SuiteFiles, build_suite, check_tasks
from harness.model.errors import SuiteError
from harness.model.suite import SuiteSpec, Task
from harness.model.units import format_validation_error, one_line, parse_size

HARBOR_FILE = "task.toml"
TB_FILE = "task.yaml"
DATASET_FILE = "harness.toml"
MAX_DEPTH = 3
DEFAULT_HARBOR_TIMEOUT = 600.0
_SECRET_REF = re.compile(r"\$\{[^}]*\}")

# The keys this harness reads (or knowingly passes over) in each table of a task file. Harbor
# and Terminal-Bench ignore a key they do not know; here it is refused with the file, the key
# and the nearest known spelling, since a misspelt ``memroy_mb`` or ``timeout_secs`` would
# otherwise run the task under the default envelope -- a different eval, silently.
# ``metadata``, ``task`` and a verifier's own ``environment`` table are free-form.
HARBOR_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"version", "schema_version", "source", "metadata", "task", "verifier", "agent", "environment",
                   "solution", "steps", "artifacts", "harness", "multi_step_reward_mode"}),
    "environment": frozenset({"build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "memory", "storage",
                              "gpus", "gpu_types", "tpus", "tpu", "allow_internet", "network_mode", "mcp_servers", "os",
                              "workdir", "env"}),
    "agent": frozenset({"timeout_sec", "user"}),
    "verifier": frozenset({"timeout_sec", "env", "user", "environment_mode", "environment"}),
    "solution": frozenset({"env"}),
    # this harness's own extension: services, a state / expectations grader
    "harness": frozenset({"services", "state", "grader", "expect", "unchanged", "allow", "tags"}),
}
TB_KEYS = frozenset({"instruction", "descriptions", "author_name", "author_email", "difficulty", "category", "tags",
                     "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec", "run_tests_in_same_shell",
                     "disable_asciinema", "estimated_duration_sec", "expert_time_estimate_min",
                     "junior_time_estimate_min", "test_scripts", "docker"})


def unknown_keys(where: str, table: str, data: dict[str, Any], known: frozenset[str]) -> list[str]:
    """One line per key of ``data`` not in ``known``: ``where: table.key: unknown key (did you
    mean 'x'?)``, or the known keys when nothing is close."""
    import difflib

    out = []
    for key in sorted(set(data) - known, key=str):
        name = one_line(f"{table}.{key}" if table else str(key), 80)  # the author's text, shown as one printable line
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
        out.append(f"{where}: {name}: unknown key, refused rather than ignored ({hint})")
    return out


def _is_task(d: Path) -> bool:
    return (d / HARBOR_FILE).is_file() or (d / TB_FILE).is_file()


def find_tasks(root: Path) -> list[Path]:
    """Task directories at or under ``root`` (a task's own subdirectories are not searched)."""
    if _is_task(root):
        return [root]
    found: list[Path] = []
    frontier = [root]
    for _ in range(MAX_DEPTH):
        nxt = []
        for d in frontier:
            for c in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
                (found if _is_task(c) else nxt).append(c)
        frontier = nxt
    return found


def is_foreign(root: Path) -> bool:
    """Does ``root`` hold Harbor / Terminal-Bench tasks?"""
    return root.is_dir() and bool(find_tasks(root))


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-._")
    return s if s and s[0].isalnum() else f"t-{s or 'task'}"


class _Ctx:
    def __init__(self, files: SuiteFiles, rel: str, problems: list[str], namespace: str = "",
                 fatal: list[str] | None = None):
        self.files, self.rel, self.problems, self.namespace = files, rel, problems, namespace
        # an author's mistake (a misspelt key): stops the suite, where a task this harness
        # cannot run (GPUs, compose) is refused alone and the others still run
        self.fatal = problems if fatal is None else fatal

    def tag(self, ident: str, role: str = "") -> str:
        """The task's image tag: namespaced by the suite (its name and where it is), so two
        suites with a task of the same name never share one."""
        return f"harness/task-{self.namespace}{ident}{role}:latest"

    def p(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    def src(self, name: str) -> str:
        return self.files.display(self.p(name))

    def refuse(self, name: str, key: str, why: str) -> None:
        self.problems.append(f"{self.src(name)}: {key}: {why}")


def load_foreign(root: Path) -> "Any":
    """The suite of Harbor / Terminal-Bench tasks under ``root``. Raises :class:`SuiteError`
    listing every problem (one line each, naming the file and the key)."""
    files = SuiteFiles(root)
    problems: list[str] = []
    dirs = find_tasks(root)
    rels = ["" if d == root else d.relative_to(root).as_posix() for d in dirs]
    fmt = "harbor" if any((d / HARBOR_FILE).is_file() for d in dirs) else "terminal-bench"
    spec = _dataset_spec(files, root, fmt, problems)
    tasks: list[Task] = []
    sources: dict[str, str] = {}
    where = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:6]
    namespace = f"{slug(spec.name)[:40]}-{where}--" if spec is not None else ""
    refused: dict[str, str] = {}  # a task this harness cannot run does not stop the others
    fatal: list[str] = []
    for d, rel in zip(dirs, rels):
        ctx = _Ctx(files, rel, problems, namespace, fatal)
        n0 = len(problems)
        manifest = HARBOR_FILE if (d / HARBOR_FILE).is_file() else TB_FILE
        try:
            data = _harbor_task(ctx, d) if manifest == HARBOR_FILE else _tb_task(ctx, d)
        except (TypeError, ValueError, AttributeError, OverflowError) as e:
            # a value of the wrong type (tags = 5, metadata = "x", timeout "abc", cpus = inf):
            # the author's to fix, one line, never a traceback
            fatal.append(f"{ctx.src(manifest)}: a value of the wrong type or out of range ({type(e).__name__}: {one_line(str(e), 160)})")
            continue
        if data is None:
            if len(dirs) > 1 and len(problems) > n0:
                refused[slug(d.name)] = "; ".join(problems[n0:])
                del problems[n0:]
            continue
        try:
            task = Task.model_validate(data, context={"state_kind": "container"})
        except ValidationError as e:
            problems.append(format_validation_error(ctx.src(manifest), e, Task))
            continue
        if task.id in sources:
            problems.append(f"{ctx.src(manifest)}: task id {task.id!r} also comes from {sources[task.id]}; rename one directory")
            continue
        task._source = d / manifest
        sources[task.id] = ctx.src(manifest)
        tasks.append(task)
    if spec is None or fatal:
        raise SuiteError("\n".join(fatal + problems))
    ok = check_tasks(files, spec, tasks, problems, lambda t: sources[t.id])
    if problems or not ok:
        raise SuiteError("\n".join(problems or [f"{files.display(r + '/' if r else '')}: {why}" for r, why in refused.items()]
                                    or [f"{root}: no task can be loaded"]))
    suite = build_suite(files, spec, sorted(ok, key=lambda t: t.id))
    return suite.model_copy(update={"refused": refused}) if refused else suite


def _dataset_spec(files: SuiteFiles, root: Path, fmt: str, problems: list[str]) -> SuiteSpec | None:
    data: dict[str, Any] = {}
    if DATASET_FILE in files.data:
        try:
            data = tomllib.loads(files.data[DATASET_FILE].decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            problems.append(f"{files.display(DATASET_FILE)}: not valid TOML: {e}")
            return None
    base = {"name": slug(root.resolve().name), "trials": 1, "k": [1], "state": "container", "dockerfile": None}
    try:
        return SuiteSpec.model_validate({**base, **data, "format": fmt})
    except ValidationError as e:
        problems.append(format_validation_error(files.display(DATASET_FILE), e, SuiteSpec))
        return None


# --------------------------------------------------------------------------- Harbor


def _harbor_task(ctx: _Ctx, d: Path) -> dict[str, Any] | None:
    try:
        cfg = tomllib.loads((d / HARBOR_FILE).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        ctx.problems.append(f"{ctx.src(HARBOR_FILE)}: not valid TOML: {e}")
        return None
    n0 = len(ctx.problems)
    if _misspelt(ctx, HARBOR_FILE, cfg):
        return None
    if cfg.get("steps"):
        ctx.refuse(HARBOR_FILE, "steps", "multi-step tasks ([[steps]]) are not supported yet")
    for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"):
        if (d / "environment" / compose).is_file():
            ctx.refuse(f"environment/{compose}", "services", "compose environments are not supported yet (one container per task; "
                       "per-attempt services go in the task's [harness] table)")
    env = cfg.get("environment") or {}
    agent = cfg.get("agent") or {}
    verifier = cfg.get("verifier") or {}
    _refuse_unsupported(ctx, env)
    instruction = _text(ctx, d, "instruction.md")
    dockerfile = (d / "environment" / "Dockerfile").is_file()
    if not dockerfile and not env.get("docker_image"):
        ctx.refuse(HARBOR_FILE, "environment", "no environment/Dockerfile and no docker_image: the task has no image")
    ext = cfg.get("harness") if isinstance(cfg.get("harness"), dict) else {}
    own_grader = any(k in ext for k in ("expect", "unchanged", "allow", "grader"))
    if not own_grader and not (d / "tests" / "test.sh").is_file():
        ctx.refuse("tests/test.sh", "verifier", "missing: a Harbor task is graded by tests/test.sh")
    meta = cfg.get("metadata") or {}
    task_tbl = cfg.get("task") or {}
    tags = [str(t) for t in (meta.get("tags") or task_tbl.get("keywords") or [])][:20]
    for k in ("difficulty", "category"):
        if meta.get(k):
            tags.append(f"{k}:{meta[k]}")
    envelope = _envelope(ctx, env, agent.get("timeout_sec", DEFAULT_HARBOR_TIMEOUT), verifier.get("timeout_sec", DEFAULT_HARBOR_TIMEOUT))
    mode = verifier.get("environment_mode") or ("separate" if verifier.get("environment") else "shared")
    if mode not in ("shared", "separate"):
        ctx.refuse(HARBOR_FILE, "verifier.environment_mode", f"{mode!r} is not shared or separate")
    ident = slug(d.name)
    grader: dict[str, Any] = {"kind": "verifier", "tests": ctx.p("tests"), "command": ["bash", "/tests/test.sh"], "mode": mode,
                              "env": _env(ctx, verifier.get("env"), "verifier.env")}
    if verifier.get("user") is not None:
        grader["user"] = str(verifier["user"])
    if mode == "separate" and (d / "tests" / "Dockerfile").is_file():
        grader["image"] = ctx.tag(ident, "--verifier")
        grader["build"] = {"context": ctx.p("tests"), "dockerfile": "Dockerfile",
                           "timeout": float(env.get("build_timeout_sec", 600.0))}
    artifacts = [str(a) if isinstance(a, str) else str((a or {}).get("source", "")) for a in (cfg.get("artifacts") or [])]
    data: dict[str, Any] = {
        "id": ident,
        "title": str(task_tbl.get("description") or task_tbl.get("name") or _first_line(instruction) or d.name)[:200],
        "prompt": instruction or "(empty instruction.md)",
        "tags": tags,
        "envelope": envelope,
        "state": {"kind": "container", "artifacts": [a for a in artifacts if a]},
        "grader": grader,
        "sandbox": {"user": str(agent["user"]) if agent.get("user") is not None else None, "workdir": env.get("workdir"),
                    "writable_root": True, "env": _env(ctx, env.get("env"), "environment.env"), "logs": True},
        "image": ctx.tag(ident),
        "build": {"context": ctx.p("environment"), "dockerfile": "Dockerfile", "image": env.get("docker_image"),
                  "timeout": float(env.get("build_timeout_sec", 600.0))},
        "requested": {k: v for k, v in env.items() if k != "env"} | {"agent.timeout_sec": agent.get("timeout_sec"),
                                                                     "verifier.timeout_sec": verifier.get("timeout_sec")},
    }
    if (d / "solution" / "solve.sh").is_file():
        data["solution"] = ctx.p("solution")
    _extension(ctx, cfg.get("harness"), data)
    return data if len(ctx.problems) == n0 else None


def _misspelt(ctx: _Ctx, name: str, cfg: dict[str, Any]) -> bool:
    """Records every unknown key of a Harbor task file (fatal); True when there was one."""
    where, typos = ctx.src(name), unknown_keys(ctx.src(name), "", cfg, HARBOR_KEYS[""])
    for table, known in HARBOR_KEYS.items():
        value = cfg.get(table) if table else None
        if table and value is not None and not isinstance(value, dict):
            typos.append(f"{where}: {table}: expected a table ([{table}]), got {type(value).__name__}")
        elif table and value:
            typos.extend(unknown_keys(where, table, value, known))
    ctx.fatal.extend(typos)
    return bool(typos)


def _refuse_unsupported(ctx: _Ctx, env: dict[str, Any]) -> None:
    if str(env.get("os", "linux")).lower() != "linux":
        ctx.refuse(HARBOR_FILE, "environment.os", f"{env['os']!r} tasks are not supported (Linux containers only)")
    for k in ("gpus", "tpus"):
        if env.get(k):
            ctx.refuse(HARBOR_FILE, f"environment.{k}", f"{k[:-1].upper()}s are not supported")
    if env.get("mcp_servers"):
        ctx.refuse(HARBOR_FILE, "environment.mcp_servers", "MCP servers are not supported yet")
    if str(env.get("network_mode", "")).lower() == "host":
        ctx.refuse(HARBOR_FILE, "environment.network_mode", "host networking is never given to a sandbox")


# what Harbor gives a task whose [environment] does not say (its EnvironmentConfig defaults)
HARBOR_DEFAULTS = {"cpus": 1, "memory_mb": 2048, "storage_mb": 10240}


def _envelope(ctx: _Ctx, env: dict[str, Any], agent_timeout: Any, verifier_timeout: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = {**{k: v for k, v in HARBOR_DEFAULTS.items() if k not in env and k.removesuffix("_mb") not in env}, **env}
    if env.get("cpus") is not None:
        try:
            cpus = float(env["cpus"])
            out["cpus"], out["cores"] = cpus, max(1, math.ceil(cpus))
        except (TypeError, ValueError):
            ctx.refuse(HARBOR_FILE, "environment.cpus", f"{env['cpus']!r} is not a number")
    for key, mb_key in (("memory", "memory_mb"), ("storage", "storage_mb")):
        try:
            if env.get(mb_key) is not None:
                out[key] = int(float(env[mb_key]) * 1024 * 1024)
            elif env.get(key) is not None:
                out[key] = parse_size(str(env[key]))
        except (TypeError, ValueError):
            ctx.refuse(HARBOR_FILE, f"environment.{mb_key if env.get(mb_key) is not None else key}", "not a size")
    mode = str(env.get("network_mode", "")).lower()
    allow = env.get("allow_internet", True)
    if not isinstance(allow, bool):
        ctx.refuse(HARBOR_FILE, "environment.allow_internet", f"{allow!r} is not true or false")
    out["network"] = "none" if mode in ("none", "no-network") or allow is False else "bridge"
    agent_s = seconds(ctx, HARBOR_FILE, "agent.timeout_sec", agent_timeout)
    grade_s = seconds(ctx, HARBOR_FILE, "verifier.timeout_sec", verifier_timeout)
    if agent_s is not None and grade_s is not None:
        out["timeouts"] = {"agent": agent_s, "grade": grade_s}
    return out


def seconds(ctx: _Ctx, name: str, key: str, value: Any) -> float | None:
    """A time limit from a task file: a positive, finite number of seconds. ``true`` is not one
    (Python would read it as 1 s) and neither is ``"abc"``; refused with the key, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    ctx.refuse(name, key, f"{one_line(repr(value), 40)} is not a positive number of seconds")
    return None


def _env(ctx: _Ctx, env: Any, key: str) -> dict[str, str]:
    if not env:
        return {}
    if not isinstance(env, dict):
        ctx.refuse(HARBOR_FILE, key, "expected a table of NAME = value")
        return {}
    out = {}
    for k, v in env.items():
        if isinstance(v, str) and _SECRET_REF.search(v):
            ctx.refuse(HARBOR_FILE, f"{key}.{k}", "secret references (${...}) are not supported yet; give the value here or drop it")
            continue
        out[str(k)] = str(v)
    return out


def _extension(ctx: _Ctx, ext: Any, data: dict[str, Any]) -> None:
    """A task's [harness] table: services, and a state / expectations grader instead of the verifier."""
    if not ext:
        return
    if not isinstance(ext, dict):
        ctx.refuse(HARBOR_FILE, "harness", "expected a table")
        return
    if set(ext) - HARBOR_KEYS["harness"]:  # recorded as fatal by _misspelt
        return
    if "services" in ext:
        data["services"] = ext["services"]
    if "tags" in ext:
        data["tags"] = [*data["tags"], *ext["tags"]]
    if "state" in ext:
        state = dict(ext["state"])
        for k in ("fixture",):
            if state.get(k):
                state[k] = ctx.p(state[k])
        if isinstance(state.get("paths"), dict):
            state["paths"] = {p: (ctx.p(r) if r else r) for p, r in state["paths"].items()}
        data["state"] = state
    if any(k in ext for k in ("expect", "unchanged", "allow", "grader")):
        grader = dict(ext.get("grader") or {"kind": "expectations"})
        for k in ("expect", "unchanged", "allow"):
            if k in ext:
                grader[k] = ext[k]
        if grader.get("tests"):
            grader["tests"] = ctx.p(grader["tests"])
        data["grader"] = grader


def _text(ctx: _Ctx, d: Path, name: str) -> str:
    try:
        return (d / name).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        ctx.refuse(name, "instruction", "missing: a task needs its instruction")
    except (UnicodeDecodeError, OSError) as e:
        ctx.refuse(name, "instruction", f"cannot read: {e}")
    return ""


def _first_line(text: str) -> str:
    return next((x.strip("# ").strip() for x in text.splitlines() if x.strip()), "")


# --------------------------------------------------------------------------- Terminal-Bench (task.yaml)


def _tb_task(ctx: _Ctx, d: Path) -> dict[str, Any] | None:
    import yaml

    try:
        cfg = yaml.safe_load((d / TB_FILE).read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        ctx.problems.append(f"{ctx.src(TB_FILE)}: not valid YAML: {str(e).splitlines()[0]}")
        return None
    if not isinstance(cfg, dict):
        ctx.problems.append(f"{ctx.src(TB_FILE)}: expected a mapping")
        return None
    n0 = len(ctx.problems)
    typos = unknown_keys(ctx.src(TB_FILE), "", cfg, TB_KEYS)
    if typos:
        ctx.fatal.extend(typos)
        return None
    instruction = cfg.get("instruction")
    if not instruction and isinstance(cfg.get("descriptions"), list) and cfg["descriptions"]:
        instruction = (cfg["descriptions"][0] or {}).get("description")
    if not instruction:
        ctx.refuse(TB_FILE, "instruction", "missing")
    if not (d / "Dockerfile").is_file():
        ctx.refuse("Dockerfile", "environment", "missing: a Terminal-Bench task is built from its Dockerfile")
    _tb_compose(ctx, d)
    if not (d / "run-tests.sh").is_file():
        ctx.refuse("run-tests.sh", "verifier", "missing: a Terminal-Bench task is graded by run-tests.sh")
    parser = str(cfg.get("parser_name", "pytest"))
    if parser != "pytest":
        ctx.refuse(TB_FILE, "parser_name", f"{parser!r}: only the pytest parser (pass = run-tests.sh exits 0) is supported")
    ident = slug(d.name)
    solution = None
    if (d / "solution.sh").is_file():
        solution = ctx.p("solution.sh")
    elif (d / "solution.yaml").is_file():
        ctx.refuse("solution.yaml", "solution", "command-list solutions are not supported yet (write solution.sh)")
    tests = ctx.p("tests") if (d / "tests").is_dir() else None
    data: dict[str, Any] = {
        "id": ident,
        "title": _first_line(str(instruction or d.name))[:200],
        "prompt": str(instruction or "(no instruction)").strip(),
        "tags": [str(t) for t in cfg.get("tags") or []][:20] + ([f"difficulty:{cfg['difficulty']}"] if cfg.get("difficulty") else []),
        "envelope": {"timeouts": {"agent": seconds(ctx, TB_FILE, "max_agent_timeout_sec", cfg.get("max_agent_timeout_sec", 180.0)),
                                  "grade": seconds(ctx, TB_FILE, "max_test_timeout_sec", cfg.get("max_test_timeout_sec", 30.0))},
                     "network": "bridge"},
        "state": {"kind": "container"},
        "grader": {"kind": "verifier", "tests": tests, "extra": {"run-tests.sh": ctx.p("run-tests.sh")},
                   "command": ["bash", "/tests/run-tests.sh"], "reward": "exit"},
        "sandbox": {"writable_root": True, "logs": True},
        "image": ctx.tag(ident),
        "build": {"context": ctx.rel or ".", "dockerfile": "Dockerfile"},
        "requested": {k: cfg.get(k) for k in ("max_agent_timeout_sec", "max_test_timeout_sec", "run_tests_in_same_shell") if k in cfg},
    }
    if solution:
        data["solution"] = solution
    return data if len(ctx.problems) == n0 else None


def _tb_compose(ctx: _Ctx, d: Path) -> None:
    """Terminal-Bench ships a one-service docker-compose.yaml with every task: that one is the
    task's own container; more services are a compose environment, not supported yet."""
    import yaml

    for name in ("docker-compose.yaml", "docker-compose.yml"):
        p = d / name
        if not p.is_file():
            continue
        try:
            doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            ctx.refuse(name, "services", f"not valid YAML: {str(e).splitlines()[0]}")
            return
        services = doc.get("services") if isinstance(doc, dict) else None
        if isinstance(services, dict) and len(services) > 1:
            ctx.refuse(name, "services", f"{len(services)} services ({', '.join(services)}): compose environments are not supported yet")
        elif isinstance(services, dict) and services:
            build = next(iter(services.values())).get("build") if isinstance(next(iter(services.values())), dict) else None
            context = build.get("context", ".") if isinstance(build, dict) else (build or ".")
            if str(context).strip("./"):
                ctx.refuse(name, "services.build.context", f"{context!r}: only the task directory itself is supported as the context")

