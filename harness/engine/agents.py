"""Who acts in an attempt: the suite's agent, your command, or a built-in one.

* ``oracle`` runs the task's reference solution, present only for it at ``/solution``
  (Harbor: ``bash /solution/solve.sh``; a native suite's ``solution`` script);
* ``nop`` does nothing (the state stays as the fixture left it);
* a suite's named agent (``[agents.NAME]`` in suite.toml, e.g. refunds' ``llm``): its command,
  environment and the network policy it needs;
* otherwise the suite's ``agent_cmd`` or ``--agent-cmd``, with the suite's ``agent_dir``
  mounted read-only at ``/harness/agent`` when it has one.

``harness suites check`` runs every task once with each built-in: the oracle must pass (the
task is solvable as packaged) and nop must fail (the grader does not accept an untouched state).
"""

from __future__ import annotations

import posixpath

from harness.model.errors import RunError
from harness.model.sandbox import AGENT_DIR, SOLUTION_DIR, Tree
from harness.model.suite import Suite, Task

ORACLE = "oracle"
NOP = "nop"
BUILTIN = (ORACLE, NOP)
MARK = "harness:"  # a run's agent_cmd for a built-in agent: ['harness:oracle']


def run_agent_cmd(agent: str | None, agent_cmd: list[str] | None, suite: Suite) -> list[str]:
    """What a run stores as its agent: a built-in's mark, or the command."""
    if agent is not None:
        if agent_cmd:
            raise RunError("give --agent (a built-in or one the suite names) or --agent-cmd (your own), not both")
        if agent in suite.agents:
            return list(suite.agents[agent].cmd)
        if agent not in BUILTIN:
            offered = ", ".join([*BUILTIN, *suite.agents])
            raise RunError(f"--agent {agent!r}: suite {suite.name} offers {offered} (your own: --agent-cmd)")
        return [MARK + agent]
    cmd = list(agent_cmd or suite.agent_cmd or [])
    if not cmd:
        raise RunError(f"suite {suite.name} names no agent; pass --agent oracle|nop, or --agent-cmd 'CMD' for your own "
                       f"(or set agent_cmd in {'harness.toml' if suite.format != 'native' else 'suite.toml'})")
    return cmd


def builtin(run_cmd: list[str]) -> str | None:
    """The built-in agent a run uses (None: a command)."""
    return run_cmd[0][len(MARK):] if len(run_cmd) == 1 and run_cmd[0].startswith(MARK) else None


def solution_missing(suite: Suite, task: Task) -> str | None:
    """Why the oracle cannot run ``task`` (None when it can)."""
    if task.solution is None:
        return f"task {task.id} has no solution (solution/solve.sh, or `solution` in its task file)"
    return None


def for_task(run_cmd: list[str], suite: Suite, task: Task) -> tuple[list[str], dict[str, Tree]]:
    """(command, read-only trees) of the agent for one attempt of ``task``."""
    which = builtin(run_cmd)
    if which == NOP:
        return ["sh", "-c", "exit 0"], {}
    if which == ORACLE:
        why = solution_missing(suite, task)
        if why:
            raise RunError(why)
        sol = task.solution or ""
        single = suite.file_bytes(sol)
        if single is not None:  # a script
            name = posixpath.basename(sol)
            path = f"{SOLUTION_DIR}/{name}"
            return (([path] if single.startswith(b"#!") else ["sh", path]), {SOLUTION_DIR: {name: (single, 0o755)}})
        return ["bash", f"{SOLUTION_DIR}/solve.sh"], {SOLUTION_DIR: suite.files_under(sol)}
    trees = {AGENT_DIR: suite.files_under(suite.agent_dir)} if suite.agent_dir else {}
    return list(run_cmd), trees
