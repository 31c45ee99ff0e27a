"""A lone command started with its container (harness.sandbox.launcher), against the same
command run through exec: what it sees, how it ends, what is measured, and what it cannot
reach. Real containers throughout."""

from __future__ import annotations

import io
import re
import time

import pytest

from harness.engine.command import run_command
from harness.model.profile import Profile
from harness.sandbox import docker_sandbox
from harness.sandbox.base import SandboxSpec
from harness.sandbox.docker_backend import DockerBackend
from harness.sandbox.docker_sandbox import DockerSandbox
from harness.sandbox.images import SANDBOX_IMAGE
from harness.sandbox.owners import LABEL

pytestmark = pytest.mark.docker

LOOK = ("python3 -c 'import os; [print(repr(k), repr(v)) for k, v in sorted(os.environ.items())]'; id; pwd; umask; ulimit -a; grep -E '^(Sig|Cap|NoNewPrivs|Seccomp|Groups)' /proc/self/status; "
        "ls -ld \"$PWD\" /tmp; ls /proc/self/fd; cat /proc/self/oom_score_adj; ps -o user=,args= -p 1 2>/dev/null || true")


def prof(**kw) -> Profile:
    base = dict(name="test", cpus=1.0, cores=1, memory="256m", pids=64, timeouts={"agent": 30})
    base.update(kw)
    return Profile.model_validate(base)


def once(client, cpu, cmd, p=None, timeout=30.0, env=None, image=SANDBOX_IMAGE):
    """run_once on a fresh sandbox; returns (Measured, whether the engine ran any exec in it)."""
    sb = DockerSandbox(client, SandboxSpec(image=image, profile=p or prof(), cpuset=cpu, labels={"dev.harness.test": "oneshot"}))
    since = int(time.time()) - 1
    try:
        m = sb.run_once(cmd, timeout=timeout, env=env)
    finally:
        sb.halt()
        sb.remove()
    # the engine's own event log says whether it ran an exec in that container
    events = client.events(since=since, until=int(time.time()) + 1, decode=True, filters={"container": sb.container.id})
    return m, any(str(e.get("Action", "")).startswith("exec_create") for e in events)


def through_exec(client, cpu, cmd, p=None, timeout=30.0, env=None, image=SANDBOX_IMAGE):
    sb = DockerSandbox(client, SandboxSpec(image=image, profile=p or prof(), cpuset=cpu))
    try:
        sb.start()
        return sb.measured_exec(cmd, timeout=timeout, env=env)
    finally:
        sb.halt()
        sb.remove()


def test_a_lone_command_starts_without_an_exec_and_sees_what_an_exec_sees(docker_client, trial_cpu):
    # values the launcher's shell would set or reset, names it uses, a name no shell takes
    env = {"GREETING": "hi there\nand = more", "IFS": ":", "PWD": "/elsewhere", "OPTIND": "7", "w": "mine", "__hw": "x",
           "a-b.c": "odd name"}
    m, execs = once(docker_client, trial_cpu, ["sh", "-c", LOOK], env=env)
    ref = through_exec(docker_client, trial_cpu, ["sh", "-c", LOOK], env=env)
    assert not execs and m.result.exit_code == 0 and ref.result.exit_code == 0
    # the container's own name and the keeper's command line differ; nothing else may
    strip = lambda s: re.sub(r"'HOSTNAME' '\w+'|sleep infinity.*", "", s)  # noqa: E731
    assert strip(m.result.stdout) == strip(ref.result.stdout)
    assert "uid=10001" in m.result.stdout
    # the environment itself, with no shell of the command's between: exactly an exec's
    show = ["python3", "-c", "import os; print(sorted((k, v) for k, v in os.environ.items() if k != 'HOSTNAME'))"]
    e, _ = once(docker_client, trial_cpu, show, env=env)
    for k, v in env.items():
        assert repr((k, v)) in e.result.stdout
    assert e.result.stdout == through_exec(docker_client, trial_cpu, show, env=env).result.stdout
    assert "CapBnd:\t0000000000000000" in m.result.stdout and "NoNewPrivs:\t1" in m.result.stdout
    ignored = int(re.search(r"SigIgn:\t([0-9a-f]+)\n", m.result.stdout).group(1), 16)
    assert not ignored & 0b110  # SIGINT (2) and SIGQUIT (3) are not ignored, as under exec (the equality above)


def test_exit_statuses_output_and_counters_are_the_commands(docker_client, trial_cpu):
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (m.result.exit_code, m.result.stdout, m.result.stderr) == (3, "out\n", "err\n")
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "kill -9 $$"])
    assert m.result.exit_code == 137 and not m.result.timed_out
    # the counters cover the cgroup from its birth: a 0.4 s spin is all there
    m, _ = once(docker_client, trial_cpu, ["python3", "-c", "import time\nt=time.time()\nwhile time.time()-t<0.4: pass\nprint('done')"])
    assert m.result.exit_code == 0 and m.result.stdout == "done\n"
    assert m.counters is not None and m.counters.cpu_usage_us >= 350_000
    assert m.counters.wall_s >= m.result.wall_s >= 0.4 and m.host is not None
    assert m.counters.memory_peak and m.counters.pids_peak >= 1


def test_all_output_written_before_the_exit_arrives_and_the_cap_holds(docker_client, trial_cpu):
    code = "import sys\nsys.stdout.write('x' * 3_000_000)\nsys.stdout.flush()\nsys.stderr.write('tail')\n"
    m, _ = once(docker_client, trial_cpu, ["python3", "-c", code], p=prof(output_cap=65536))
    r = m.result
    assert r.exit_code == 0 and r.stdout_bytes == 3_000_000 and r.stdout_truncated and "bytes dropped here" in r.stdout
    assert r.stderr == "tail" and r.stderr_bytes == 4


def test_a_missing_or_unexecutable_command_is_a_start_error_as_under_exec(docker_client, trial_cpu):
    m, _ = once(docker_client, trial_cpu, ["nosuchcmd", "x"])
    assert m.result.exit_code == 127 and m.result.start_error.startswith("command not found in the sandbox: nosuchcmd")
    assert "env:" not in m.result.stderr  # the launcher's words are not the command's output
    m, _ = once(docker_client, trial_cpu, ["/etc/passwd"])
    assert m.result.exit_code == 126 and m.result.start_error.startswith("command cannot be executed in the sandbox: /etc/passwd")
    m, _ = once(docker_client, trial_cpu, ["/tmp"])
    assert m.result.exit_code == 126 and m.result.start_error.startswith("command cannot be executed in the sandbox: /tmp")
    m, _ = once(docker_client, trial_cpu, ["./nothing-here"])
    assert m.result.exit_code == 127 and m.result.start_error.startswith("command not found in the sandbox: ./nothing-here")
    ref = through_exec(docker_client, trial_cpu, ["nosuchcmd", "x"])
    assert ref.result.exit_code == 127 and ref.result.start_error.startswith("command not found in the sandbox: nosuchcmd")
    # a command that exits 127 itself is not a start error
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "exit 127"])
    assert m.result.exit_code == 127 and m.result.start_error is None


def test_a_timeout_kills_the_tree_and_what_it_left_running_ends_with_it(docker_client, trial_cpu):
    m, _ = once(docker_client, trial_cpu, ["sleep", "1000"], timeout=1.0)
    assert m.result.timed_out and 0.9 <= m.result.wall_s < 5
    # an orphan that lets go of the output ends at the command's exit, before the second reading
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo started"])
    assert m.result.stdout == "started\n" and m.result.exit_code == 0 and m.result.wall_s < 5
    r = run_command(DockerBackend(docker_client), SANDBOX_IMAGE, prof(), trial_cpu, ["sleep", "60"], timeout=0.01)
    assert r.kind == "timeout" and r.exec.timed_out


def test_the_command_cannot_reach_its_keeper(docker_client, trial_cpu):
    """The init and the keeper are root, the command is not: it can neither signal nor ptrace
    them, nor reach the stdin the keeper blocks on (its own stdin is /dev/null, as under exec),
    so the keeper never reaps it and the command's status stays the kernel's to read."""
    attack = ("kill -9 -1; for p in 1 2 3; do kill -9 $p; kill -STOP $p; kill -TERM $p; kill -CONT $p; done; "
              "for p in 1 2 3; do for f in 0 3; do echo x >/proc/$p/fd/$f && echo wrote-$p-$f; done; done 2>/dev/null; "
              "cat /proc/1/environ /proc/3/environ >/dev/null 2>&1 && echo read-keeper; "
              "cat; echo stdin-empty; "
              "python3 -c 'import ctypes; l=ctypes.CDLL(None); print(\"ptrace\", [l.ptrace(16, p, 0, 0) for p in (1, 2, 3)])'; "
              "sleep 0.3; echo alive")
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", attack], timeout=20)
    r = m.result
    # kill -1 reaches every process but the caller and the init: the container stays up, so the
    # command's end is measured and its status is the kernel's
    assert r.exit_code == 0 and r.stdout.endswith("stdin-empty\nptrace [-1, -1, -1]\nalive\n") and m.counters is not None
    assert "read-keeper" not in r.stdout and "wrote-" not in r.stdout and not r.timed_out


def test_orphans_are_reaped_as_under_exec(docker_client, trial_cpu):
    """Orphans go to the init, which reaps them; only the command itself is kept unreaped (by
    the keeper), so 200 short-lived orphans never fill a limit of 64 pids."""
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "for i in $(seq 200); do (true &); done; sleep 0.2; echo ok"], p=prof(pids=64))
    assert m.result.exit_code == 0 and m.result.stdout == "ok\n" and m.counters.pids_limit_hits == 0


def test_what_the_launcher_cannot_serve_runs_through_exec(docker_client, trial_cpu):
    tag = "harness/test-no-launcher:latest"
    docker_client.images.build(fileobj=io.BytesIO(b"FROM harness/sandbox:latest\nUSER 0\nRUN rm /usr/bin/setpriv\n"), tag=tag,
                               labels={LABEL: "1"}, rm=True, forcerm=True)
    docker_sandbox._NO_LAUNCHER.discard(tag)
    try:
        m, execs = once(docker_client, trial_cpu, ["sh", "-c", "echo ran; id -u"], image=tag)
        assert execs and m.result.stdout == "ran\n10001\n" and m.counters is not None
        assert tag in docker_sandbox._NO_LAUNCHER  # asked once per image in a process
        m, execs = once(docker_client, trial_cpu, ["sh", "-c", "echo again"], image=tag)
        assert execs and m.result.stdout == "again\n"
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)
    # a command env would take for an assignment, and the switch, go through exec too
    m, execs = once(docker_client, trial_cpu, ["A=B"])
    assert execs and m.result.exit_code == 127
    docker_sandbox.ONESHOT = False
    try:
        m, execs = once(docker_client, trial_cpu, ["true"])
        assert execs and m.result.exit_code == 0
    finally:
        docker_sandbox.ONESHOT = True


def test_a_command_at_its_memory_ceiling_is_oom_killed_never_an_engine_error(docker_client, trial_cpu):
    code = "b = []\nwhile True: b.append(bytearray(8 << 20))\n"
    r = run_command(DockerBackend(docker_client), SANDBOX_IMAGE, prof(memory="64m"), trial_cpu, ["python3", "-c", code])
    assert r.kind == "oom_killed" and r.counters.oom_kills >= 1 and r.exec.exit_code == 137


def test_a_path_the_command_writes_into_never_picks_the_launchers_tools(docker_client, trial_cpu):
    """With a writable directory first in PATH, a command that plants ``sleep``, ``setpriv`` and
    ``setsid`` there while the launcher is still to exec its keeper gets none of them run: the
    launcher found its tools in the image's system directories before the fork."""
    plant = "for t in sleep setpriv setsid env; do ln -s /usr/bin/false /tmp/$t; done; exit 42"
    for _ in range(12):
        m, _ = once(docker_client, trial_cpu, ["sh", "-c", plant], env={"PATH": "/tmp:/usr/local/bin:/usr/bin:/bin"})
        assert m.result.exit_code == 42 and m.counters is not None, m.result


def test_only_the_launchers_own_failure_is_a_start_error(docker_client, trial_cpu):
    """A start error is the launcher's finding before its fork, never read from the command's
    process: a command that runs an ``env`` of its own which then fails, or that renames
    itself and exits 126/127, is the command failing, with its output kept."""
    m, _ = once(docker_client, trial_cpu, ["nice", "env", "FOO=1", "mytool"])
    assert m.result.exit_code == 127 and m.result.start_error is None and "mytool" in m.result.stderr
    m, _ = once(docker_client, trial_cpu, ["sh", "-c", "echo important; exec env /nope"])
    assert m.result.exit_code == 127 and m.result.start_error is None and m.result.stdout == "important\n"
    for name in ("env", "harness-env", "setpriv", "sh"):
        for code in (126, 127):
            forge = f"echo visible; printf {name} > /proc/$$/comm; exit {code}"
            m, _ = once(docker_client, trial_cpu, ["sh", "-c", forge])
            assert (m.result.exit_code, m.result.start_error, m.result.stdout) == (code, None, "visible\n")
    # an engine that refuses the container is no finding about the image: it keeps its launcher
    m, _ = once(docker_client, trial_cpu, ["true"], env={"=x": "1"})
    assert SANDBOX_IMAGE not in docker_sandbox._NO_LAUNCHER


def test_job_control_signals_and_the_clock_are_as_under_exec(docker_client, trial_cpu):
    """The command leads its own session as an exec'd one does: a stop signal to itself is
    dropped (an orphaned process group), not a stop until the timeout. Its clock starts once
    the engine has started it: a 30 ms command fits a 0.5 s timeout."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTSTP); print('survived', os.getsid(0) == os.getpid())"
    m, _ = once(docker_client, trial_cpu, ["python3", "-c", code], timeout=5)
    ref = through_exec(docker_client, trial_cpu, ["python3", "-c", code], timeout=5)
    assert m.result.stdout == ref.result.stdout == "survived True\n" and not m.result.timed_out
    m, _ = once(docker_client, trial_cpu, ["sleep", "0.03"], timeout=0.5)
    assert not m.result.timed_out and m.result.exit_code == 0 and m.result.wall_s < 0.5


def test_a_ceiling_that_takes_the_keeper_is_still_the_commands_oom_kill(docker_client, trial_cpu):
    """tmpfs filled to the ceiling (memory of no process), then more asked for: where the
    controller cannot spare the keeper (no CAP_SYS_RESOURCE) the OOM killer may take it, and
    the command's status goes with the container; the kernel's count still makes it the
    command's oom_killed, never an engine error."""
    fill = ("head -c 200m /dev/zero >/work/f 2>/dev/null; head -c 64m /dev/zero >/tmp/f 2>/dev/null; "
            "python3 -c 'b = bytearray(120 << 20)'")
    for _ in range(3):
        r = run_command(DockerBackend(docker_client), SANDBOX_IMAGE, prof(memory="256m", tmpfs={"/work": "300m", "/tmp": "100m"}),
                        trial_cpu, ["sh", "-c", fill])
        # the kernel's count where the cgroup was read; where the container went first, the engine's word
        assert r.kind == "oom_killed" and (r.counters.oom_kills >= 1 if r.counters else "OOM-killed True" in r.exec.stderr), \
            (r.kind, r.exec, r.error)


def test_output_past_the_cap_by_less_than_half_is_still_cut(docker_client, trial_cpu):
    m, _ = once(docker_client, trial_cpu, ["python3", "-c", "print('y' * 1_400_000, end='')"], p=prof(output_cap=1 << 20))
    r = m.result
    kept = re.sub(r"\n\[harness: truncated, 351424 bytes dropped here[^\]]*\]\n", "", r.stdout)
    assert r.stdout_bytes == 1_400_000 and r.stdout_truncated and kept == "y" * (1 << 20)


def test_an_image_without_a_shell_runs_the_command_through_exec(docker_client, trial_cpu):
    tag = "harness/test-no-shell:latest"
    docker_client.images.build(fileobj=io.BytesIO(b"FROM harness/sandbox:latest\nUSER 0\nRUN rm /bin/sh /usr/bin/sh 2>/dev/null; rm -f /bin/dash\n"),
                               tag=tag, labels={LABEL: "1"}, rm=True, forcerm=True)
    try:
        m, execs = once(docker_client, trial_cpu, ["python3", "-c", "print('ran')"], image=tag)
        assert execs and m.result.stdout == "ran\n" and m.counters is not None
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)


def _image(client, tag: str, run: str) -> None:
    client.images.build(fileobj=io.BytesIO(f"FROM harness/sandbox:latest\nUSER 0\nRUN {run}\n".encode()), tag=tag,
                        labels={LABEL: "1"}, rm=True, forcerm=True)


def test_a_shell_that_reaps_in_the_background_still_leaves_the_status_to_the_kernel(docker_client, trial_cpu):
    """bash as /bin/sh reaps finished children from its SIGCHLD handler, even while it blocks
    in ``read``: its keeper holds the command as ``sleep infinity`` instead. The groups are the
    exec's (the gid alone), even where /etc/group lists the user in others."""
    tag = "harness/test-bash-sh:latest"
    _image(docker_client, tag, "ln -sf bash /bin/sh && echo 'extra:x:3000:agent' >> /etc/group")
    try:
        for _ in range(5):
            m, execs = once(docker_client, trial_cpu, ["sh", "-c", "echo hi; id -G; exit 4"], image=tag)
            assert not execs and (m.result.exit_code, m.result.stdout) == (4, "hi\n10001\n"), m.result
            m, execs = once(docker_client, trial_cpu, ["true"], image=tag)
            assert not execs and m.result.exit_code == 0 and m.counters is not None, m.result
        m, _ = once(docker_client, trial_cpu, ["sh", "-c", "echo \"[$PS4]\""], image=tag, env={"PS4": "custom> "})
        assert m.result.stdout == "[custom> ]\n"
        # shell options from the environment trace the command alone, and it gets them as given
        show = ["sh", "-c", "echo hi; case $SHELLOPTS in *xtrace*) echo 1;; esac"]  # (no pipeline: its members trace in any order)
        m, _ = once(docker_client, trial_cpu, show, image=tag, env={"SHELLOPTS": "xtrace"})
        ref = through_exec(docker_client, trial_cpu, show, image=tag, env={"SHELLOPTS": "xtrace"})
        assert (m.result.stdout, m.result.stderr) == (ref.result.stdout, ref.result.stderr) and m.result.stdout == "hi\n1\n"
        assert tag not in docker_sandbox._NO_LAUNCHER
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)


def test_an_env_that_forks_is_never_taken_for_the_keeper(docker_client, trial_cpu):
    """The launcher's check of ``env`` is a root child of the init; where ``env`` is a wrapper
    that forks (and dawdles), that child has a child of its own while the keeper is still to
    come: the controller waits for the keeper proper."""
    tag = "harness/test-env-wrapper:latest"
    _image(docker_client, tag, "mv /usr/bin/env /usr/bin/env.real && printf '#!/bin/sh\\ncase \"$*\" in *--version*) sleep 0.2;; esac\\n"
                               "/usr/bin/env.real \"$@\"\\n' > /usr/bin/env && chmod 755 /usr/bin/env")
    try:
        for _ in range(4):
            m, execs = once(docker_client, trial_cpu, ["sh", "-c", "echo ran; exit 3"], image=tag)
            assert not execs and (m.result.exit_code, m.result.stdout) == (3, "ran\n"), m.result
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)


def test_a_launcher_killed_before_it_held_the_command_never_runs_it_again(docker_client, trial_cpu):
    """The init's exit code, where it ended before its keeper held the command, decides: its own
    statuses and a shell's error (below 126) fall back to exec or say the command is not there;
    a kill (the memory ceiling, 137) may have come after the fork, so nothing runs again."""
    sb = DockerSandbox(docker_client, SandboxSpec(image=SANDBOX_IMAGE, profile=prof(), cpuset=trial_cpu))
    for code, raised in ((99, docker_sandbox._NoLauncher), (2, docker_sandbox._NoLauncher), (126, docker_sandbox._NoLauncher),
                         (98, docker_sandbox._NeverStarted), (97, docker_sandbox._NeverStarted), (137, docker_sandbox.SandboxError),
                         (96, docker_sandbox.SandboxError), (None, docker_sandbox.SandboxError)):
        with pytest.raises(raised) as e:
            sb._launcher_ended(code)
        assert type(e.value) is raised
        if raised is docker_sandbox._NoLauncher:
            assert e.value.lacks == (code == 99)
    docker_sandbox._NO_LAUNCHER.discard(SANDBOX_IMAGE)  # (96 remembered it)


def test_a_keeper_that_ends_by_itself_never_gets_its_command_run_twice(docker_client, trial_cpu):
    """Under a shell that reaps, the keeper is ``sleep``: one that ends at once (a wrapper
    exiting 1) leaves the command without a keeper, after its fork: an infra error (never a
    fallback to exec, which would run it again), and the image runs through exec afterwards."""
    tag = "harness/test-sleep-ends:latest"
    _image(docker_client, tag, "ln -sf bash /bin/sh && mv /usr/bin/sleep /usr/bin/sleep.real && printf '#!/bin/dash\\n"
                               "case \"$1:$(id -u)\" in infinity:0) exit 1;; esac\\nexec /usr/bin/sleep.real \"$@\"\\n' > /usr/bin/sleep "
                               "&& chmod 755 /usr/bin/sleep")
    since = int(time.time()) - 1
    try:
        for _ in range(3):
            docker_sandbox._NO_LAUNCHER.discard(tag)
            r = run_command(DockerBackend(docker_client), tag, prof(), trial_cpu, ["sh", "-c", "echo ran; exit 5"],
                            labels={"dev.harness.test": "keeper-ends"})
            assert r.kind == "infra_error" and tag in docker_sandbox._NO_LAUNCHER, (r.kind, r.exec, r.error)
        events = docker_client.events(since=since, until=int(time.time()) + 1, decode=True, filters={"label": "dev.harness.test=keeper-ends"})
        assert not [e for e in events if str(e.get("Action", "")).startswith("exec_create")]
        r = run_command(DockerBackend(docker_client), tag, prof(), trial_cpu, ["sh", "-c", "echo ran; exit 5"])
        assert (r.exec.exit_code, r.exec.stdout) == (5, "ran\n")  # through exec now
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)


def test_a_setpriv_without_the_launchers_options_runs_the_command_through_exec(docker_client, trial_cpu):
    """The launcher's fork that never left root (its setpriv refused the options) never ran
    the command: the kernel's uid of that zombie says so, and the command runs through exec."""
    tag = "harness/test-setpriv-old:latest"
    _image(docker_client, tag, "printf '#!/bin/sh\\necho \"setpriv: unrecognized option: $1\" >&2; exit 1\\n' > /usr/bin/setpriv "
                               "&& chmod 755 /usr/bin/setpriv")
    docker_sandbox._NO_LAUNCHER.discard(tag)
    try:
        m, execs = once(docker_client, trial_cpu, ["sh", "-c", "echo ran"], image=tag)
        assert execs and (m.result.exit_code, m.result.stdout, m.result.stderr) == (0, "ran\n", "") and tag in docker_sandbox._NO_LAUNCHER
    finally:
        docker_sandbox._NO_LAUNCHER.discard(tag)
        docker_client.images.remove(tag, force=True)


def test_an_empty_home_is_filled_in_as_under_exec(docker_client, trial_cpu):
    show = ["sh", "-c", "echo \"[$HOME]\""]
    m, _ = once(docker_client, trial_cpu, show, env={"HOME": ""})
    assert m.result.stdout == through_exec(docker_client, trial_cpu, show, env={"HOME": ""}).result.stdout == "[/work]\n"
