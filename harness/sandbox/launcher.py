"""The one-shot launcher: a sandbox whose only workload is one command starts it with the
container, without an ``exec`` (~35 ms of engine round trips and a runc exec per attempt).

The container's init is ``docker-init``, as in every workload sandbox; its one child is
``sh`` as root with only SETUID, SETGID and SETPCAP. That shell forks the command under the
workload's uid:gid with no capabilities and an empty bounding set (``setpriv``), in a
session of its own as an exec'd process has (``setsid``), resetting the SIGINT/SIGQUIT that
the shell's ``&`` ignores (``env --default-signal``), then ``exec``s
itself into the keeper: ``sleep infinity`` under the keeper uid, all capabilities gone, its
output on /dev/null. From then on the container is an ``exec`` sandbox's: an init reaping
orphans and a keeper of another uid than the workload's (it can neither signal nor ptrace
them). The keeper never reaps a child (it carries the command's pid as an argument), so
the command stays a zombie once it exits: the controller sees the exit through a pidfd and
reads its status from the kernel (``/proc/PID/stat``), while the container, and so its
cgroup and counters, stays up until the controller halts it.

Before its fork the launcher looks the command up as root with shell builtins (its PATH, or
the path given): a command that is not there, or cannot be executed, is the launcher's exit
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
# Every tool is found in the image's system directories by the shell's builtins before the
# fork (never through a PATH the command may write into: those run as root), and the shell's
# variables are never exported, so the command's environment is the container's, less what
# the shell itself sets (PWD, and IFS/OPTIND/PPID it resets), which the controller gives back.
SCRIPT = r"""__hw=$1 __hk=$2 __hh=$3 __hb=$4
shift 4
for __hd in /usr/bin /bin /usr/sbin /sbin; do
  [ -n "$__hsp" ] || { [ -x "$__hd/setpriv" ] && __hsp=$__hd/setpriv; }
  [ -n "$__hss" ] || { [ -x "$__hd/setsid" ] && __hss=$__hd/setsid; }
  [ -n "$__hsl" ] || { [ -x "$__hd/sleep" ] && __hsl=$__hd/sleep; }
  [ -n "$__hse" ] || { [ -x "$__hd/env" ] && __hse=$__hd/env; }
done
[ -n "$__hsp" ] && [ -n "$__hss" ] && [ -n "$__hsl" ] && [ -n "$__hse" ] && "$__hse" --default-signal=INT --version >/dev/null 2>&1 || exit 99
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
__hu=${__hw%%:*} __hg=${__hw#*:} __hgr=--groups=${__hw#*:}
if [ "$__hh" = 1 ]; then HOME=/; export HOME; fi
if [ -r /etc/passwd ]; then
  while IFS=: read -r __hn __hp __hi __hj __hc __hd __hs || [ -n "$__hn" ]; do
    if [ "$__hi" = "$__hu" ]; then
      [ "$__hj" = "$__hg" ] && __hgr=--init-groups
      if [ "$__hh" = 1 ]; then HOME=$__hd; fi
      break
    fi
  done </etc/passwd
fi
"$__hsp" --reuid="$__hu" --regid="$__hg" $__hgr --inh-caps=-all --bounding-set=-all -- "$__hss" "$__hse" --default-signal=INT,QUIT __UNSET__ -- "$@" &
exec "$__hsp" --reuid="$__hk" --regid="$__hk" --clear-groups --inh-caps=-all --bounding-set=-all -- "$__hsl" infinity "$!" </dev/null >/dev/null 2>&1
"""
CAPS = ["SETUID", "SETGID", "SETPCAP"]
# what the shell sets or resets, and its own variables: unset for the command, and given back
# as assignments where the caller set them (an image's own values of these names, and its
# variables whose names no shell takes, are lost)
SHELL_SETS = ("PWD", "OLDPWD", "IFS", "OPTIND", "PPID", *sorted(set(re.findall(r"\b__h[a-z]+\b", SCRIPT))))
SCRIPT = SCRIPT.replace("__UNSET__", " ".join(f"-u {k}" for k in SHELL_SETS))


def eligible(user: str, cmd: list[str]) -> bool:
    """A numeric non-root uid:gid (no name to look up), and a command ``env`` cannot take for
    an assignment."""
    return re.fullmatch(r"[1-9]\d*:\d+", user) is not None and bool(cmd) and "=" not in cmd[0]


def argv(user: str, keeper_uid: str, set_home: bool, given: dict[str, str], cmd: list[str]) -> list[str]:
    """The entrypoint and its arguments: of ``given`` (the caller's environment), the variables
    the shell sets, resets or drops (a name no shell takes) are put back as ``env`` assignments
    before the command."""
    back = [f"{k}={v}" for k, v in given.items() if k in SHELL_SETS or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    return ["/bin/sh", "-c", SCRIPT, "harness-launch", user, keeper_uid, "1" if set_home else "0", str(len(back)), *back, *cmd]


def workload_of(keeper_pid: int) -> int | None:
    """The host pid of the launcher's fork once the launcher has become the keeper, or None before.
    The keeper carries the fork's pid in its own namespace as its last argument (``sleep
    infinity PID`` sleeps forever all the same): written by the launcher, in a process of
    another uid than the workload's, so the workload cannot change it; it is matched against
    the namespace pids of the keeper's children."""
    try:
        args = Path(f"/proc/{keeper_pid}/cmdline").read_bytes().split(b"\0")
        if len(args) < 3 or os.path.basename(args[0]) != b"sleep" or not args[2].isdigit():
            return None
        nspid = args[2].decode()
        kids = Path(f"/proc/{keeper_pid}/task/{keeper_pid}/children").read_text().split()
    except OSError:
        return None
    for k in kids:
        try:
            for line in Path(f"/proc/{k}/status").read_text().splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == nspid:
                    return int(k)
        except OSError:
            continue
    return None


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
