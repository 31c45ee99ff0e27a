"""The one-shot launcher: a sandbox whose only workload is one command starts it with the
container, without an ``exec`` (~35 ms of engine round trips and a runc exec per attempt).

The container's init is the launcher's ``sh``, as root with only SETUID, SETGID and SETPCAP
(no ``docker-init``: its bind mount and its exec cost ~3 ms a container). It forks a subshell,
the keeper, which forks the command under the workload's uid:gid with no capabilities and an
empty bounding set (``setpriv``), in a session of its own as an exec'd process has
(``setsid``), resetting the SIGINT/SIGQUIT that the shell's ``&`` ignores (``env
--default-signal``), then blocks reading the container's stdin, which the engine holds open
and nobody writes (the command gets /dev/null, as under exec): no exec of its own, and it
never reaps its child, so the command stays a zombie once it exits. (Under a shell that
reaps its children in the background, bash and the like, it ``exec``s ``sleep infinity``
at once instead, as root.) The controller sees the exit through a pidfd and reads its
status from the kernel (``/proc/PID/stat``), while the container, and so its cgroup and
counters, stays up until the controller halts it. The init meanwhile ``wait``s for the keeper, reaping every orphan reparented to it on the way, as
``docker-init`` does under exec. Both are root, the command is not: it can neither signal
nor ptrace them, and no other root process is ever in the container (NoNewPrivs).

Before its fork the launcher looks the command up as root with shell builtins (its PATH, or
the path given): a command that is not there, or cannot be executed, is the init's exit
status, which no code of the command's can forge. Nothing the workload writes is parsed: its
status is the kernel's, its output the engine's attach stream, capped like an exec's."""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.model.units import printable_line

# exits 99 before anything else runs where the image lacks what the launcher needs
# (setpriv and setsid from util-linux, env with --default-signal from coreutils >= 8.31,
# sleep, a POSIX sh): the command then runs through exec as every other workload
NO_LAUNCHER = 99
# exits NOT_FOUND / NOT_EXECUTABLE, before the fork, where the command is not in the sandbox
# (not in its PATH, no such file) or cannot be executed (a directory, no execute bit): the
# launcher's word, before any of the command's code has run, so the command cannot forge it
NOT_FOUND, NOT_EXECUTABLE = 98, 97
# exits KEEPER_ENDED once its keeper ended, whatever ended it: the command may have started
KEEPER_ENDED = 96
# Every tool is found in the image's system directories by the shell's builtins before the
# fork (never through a PATH the command may write into: those run as root), and the shell's
# variables are never exported, so the command's environment is the container's, less what
# the shell itself sets (PWD, and IFS/OPTIND/PPID it resets), which the controller gives back.
SCRIPT = r"""{ set +aefux; } 2>/dev/null
__hw=$1 __hh=$2 __hb=$3
shift 3
for __hd in /usr/bin /bin /usr/sbin /sbin; do
  [ -n "$__hsp" ] || { [ -x "$__hd/setpriv" ] && __hsp=$__hd/setpriv; }
  [ -n "$__hss" ] || { [ -x "$__hd/setsid" ] && __hss=$__hd/setsid; }
  [ -n "$__hsl" ] || { [ -x "$__hd/sleep" ] && __hsl=$__hd/sleep; }
  [ -n "$__hse" ] || { [ -x "$__hd/env" ] && __hse=$__hd/env; }
done
[ -n "$__hsp" ] && [ -n "$__hss" ] && [ -n "$__hsl" ] && [ -n "$__hse" ] && "$__hse" --default-signal=INT,QUIT -u __hx --version >/dev/null 2>&1 || exit 99
eval "__hc=\${$((__hb + 1))}"
case $__hc in
  */*) [ -e "$__hc" ] || exit 98
       { [ -d "$__hc" ] || ! [ -x "$__hc" ]; } && exit 97 ;;
  *) __hf= __hi=$IFS
     IFS=:
     for __hd in ${PATH-/bin:/usr/bin}; do
       if [ -f "${__hd:-.}/$__hc" ] && [ -x "${__hd:-.}/$__hc" ]; then __hf=1; break; fi
     done
     IFS=$__hi
     [ -n "$__hf" ] || exit 98 ;;
esac
__hu=${__hw%%:*} __hg=${__hw#*:}
if [ "$__hh" = 1 ]; then
  HOME=/
  [ -r /etc/passwd ] && while IFS=: read -r __hn __hp __hi __hj __hc __hd __hs || [ -n "$__hn" ]; do
    if [ "$__hi" = "$__hu" ]; then HOME=$__hd; break; fi
  done </etc/passwd
  export HOME
fi
exec 3<&0
(
  "$__hsp" --reuid="$__hu" --regid="$__hg" --groups="$__hg" --inh-caps=-all --bounding-set=-all -- "$__hss" "$__hse" --default-signal=INT,QUIT __UNSET__ -- "$@" 3<&- &
  [ -n "$BASH_VERSION$ZSH_VERSION$KSH_VERSION$YASH_VERSION$BB_ASH_VERSION" ] || read -r __hx <&3 2>/dev/null
  unset LD_PRELOAD LD_LIBRARY_PATH LD_AUDIT
  exec "$__hsl" infinity 3<&- </dev/null >/dev/null 2>&1
) &
exec 3<&-
wait $! || exit 96
exit 96
"""
CAPS = ["SETUID", "SETGID", "SETPCAP"]
# what the shell sets or resets, and its own variables: unset for the command, and given back
# as assignments where the caller set them (an image's own values of these names, and its
# variables whose names no shell takes, are lost)
SHELL_SETS = ("PWD", "OLDPWD", "IFS", "OPTIND", "PPID", "PS4", "SHLVL", "_", "SHELLOPTS", "BASHOPTS", *sorted(set(re.findall(r"\b__h[a-z]+\b", SCRIPT))))
SCRIPT = SCRIPT.replace("__UNSET__", " ".join(f"-u {k}" for k in SHELL_SETS))


def eligible(user: str, cmd: list[str]) -> bool:
    """A numeric non-root uid:gid (no name to look up), and a command ``env`` cannot take for
    an assignment."""
    return re.fullmatch(r"[1-9]\d*:\d+", user) is not None and bool(cmd) and "=" not in cmd[0]


def argv(user: str, set_home: bool, given: dict[str, str], cmd: list[str]) -> list[str]:
    """The entrypoint and its arguments: of ``given`` (the caller's environment), the variables
    the shell sets, resets or drops (a name no shell takes) are put back as ``env`` assignments
    before the command."""
    back = [f"{k}={v}" for k, v in given.items() if k in SHELL_SETS or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    return ["/bin/sh", "-c", SCRIPT, "harness-launch", user, "1" if set_home else "0", str(len(back)), *back, *cmd]


def launched(init_pid: int) -> tuple[int, int] | None:
    """(keeper, command) host pids once the launcher has forked the command, or None before.
    The keeper is a root child of the init that is the init's own fork (the same command
    line) or, under a shell that reaps in the background, that fork become ``sleep
    infinity``; its one child is the command. Nothing else qualifies: the init's other root
    child, its check of ``env`` (a wrapper script's fork included), has another command
    line, and the command and what it forks are never root (another uid, NoNewPrivs)."""
    try:
        init_args = Path(f"/proc/{init_pid}/cmdline").read_bytes()
    except OSError:
        return None
    for k in children(init_pid):
        try:
            args = Path(f"/proc/{k}/cmdline").read_bytes()
        except OSError:
            continue
        argv = args.split(b"\0")
        if not still_root(k) or (args != init_args and not (len(argv) >= 2 and os.path.basename(argv[0]) == b"sleep" and argv[1] == b"infinity")):
            continue
        kids = children(k)
        if kids:
            return k, kids[0]
    return None


def children(pid: int) -> list[int]:
    """Host pids of the children of process ``pid`` (none where it is gone)."""
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def exit_status(pid: int) -> int | None:
    """The wait status of an exited process its parent has not reaped, from the kernel; None
    when it still runs or is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    if not fields or fields[0] != "Z":
        return None
    return int(fields[-1])


def status_field(pid: int, key: str) -> list[str] | None:
    """The values of one line of /proc/PID/status (``key`` as ``"Uid:"``), None where the process
    is gone or has no such line."""
    try:
        return next(ln.split()[1:] for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith(key))
    except (OSError, StopIteration):
        return None


def still_root(pid: int) -> bool:
    """Whether process ``pid`` (an unreaped one included) has root's real uid: the launcher's
    fork before it became the workload's uid, which no process of the command's can have."""
    uid = status_field(pid, "Uid:")
    return uid is not None and uid[0] == "0"


def exit_code(status: int) -> int:
    """A shell's number for a wait status: the exit code, or 128 + the signal that ended it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def never_started(code: int | None, cmd: list[str]) -> str | None:
    """Why the command never ran, from the launcher's exit status before its fork (None when it
    did not stop there)."""
    name = printable_line(cmd[0])
    if code == NOT_FOUND:
        where = "no such file" if "/" in cmd[0] else "executable file not found in $PATH"
        return f"command not found in the sandbox: {name} ({where})"
    if code == NOT_EXECUTABLE:
        return f"command cannot be executed in the sandbox: {name} (a directory, or no execute permission)"
    return None
