"""The harness's seccomp profile (harness.sandbox.seccomp): its content, and real containers
under it (ordinary workloads work; io_uring, AF_VSOCK, namespaces and mount are refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import missing

from harness.model.profile import Profile
from harness.sandbox import seccomp
from harness.sandbox.base import ROOT_CAPS, SandboxSpec
from harness.sandbox.basemap import PYTHON_IMAGE
from harness.sandbox.docker_sandbox import DockerSandbox
from harness.sandbox.images import SANDBOX_IMAGE

HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
DOCKER_DOCUMENTED = {
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "finit_module",
    "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load",
    "keyctl", "lookup_dcookie", "mbind", "mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev", "query_module",
    "quotactl", "reboot", "request_key", "set_mempolicy", "setns", "settimeofday", "stime", "swapon", "swapoff",
    "sysfs", "_sysctl", "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86", "vm86old",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
}
IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
MASK64 = (1 << 64) - 1


def prof(**kw) -> Profile:
    base = {"name": "test", "cpus": 1.0, "cores": 1, "memory": "256m", "pids": 128, "timeouts": {"agent": 30}}
    base.update(kw)
    return Profile.model_validate(base)


def loaded() -> dict:
    return json.loads(seccomp.profile_json())


def rules_for(name: str) -> list[dict]:
    return [r for r in loaded()["syscalls"] if name in r["names"]]


def _matches(arg: dict, value: int) -> bool:
    """One argument comparison as the kernel filter evaluates it (64-bit register)."""
    op, v, v2 = arg["op"], arg["value"], arg["valueTwo"]
    return {
        "SCMP_CMP_EQ": lambda: value == v, "SCMP_CMP_NE": lambda: value != v,
        "SCMP_CMP_LT": lambda: value < v, "SCMP_CMP_LE": lambda: value <= v,
        "SCMP_CMP_GT": lambda: value > v, "SCMP_CMP_GE": lambda: value >= v,
        "SCMP_CMP_MASKED_EQ": lambda: value & v == v2,
    }[op]()


def action(name: str, arg0: int) -> tuple[str, int | None]:
    """The action the profile takes for ``name(arg0, ...)`` (rules are disjoint here)."""
    hits = [r for r in rules_for(name) if all(_matches(a, arg0) for a in r.get("args", []) if a["index"] == 0)]
    acts = {(r["action"], r.get("errnoRet")) for r in hits}
    assert len(acts) <= 1, (name, arg0, acts)  # never two answers for one call
    return acts.pop() if acts else (loaded()["defaultAction"], loaded().get("defaultErrnoRet"))


# --------------------------------------------------------------------------- the profile itself


def test_profile_is_json_refusing_by_default_with_eperm():
    p = loaded()
    assert p["defaultAction"] == "SCMP_ACT_ERRNO" and p["defaultErrnoRet"] == 1
    assert seccomp.profile_json() is seccomp.profile_json()  # cached
    assert seccomp.security_opt() == "seccomp=" + seccomp.profile_json()
    for r in p["syscalls"]:
        assert r["names"] and r["action"] in ("SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"), r
        assert "name" not in r  # Docker refuses `name` beside `names`
    assert "architectures" not in p  # Docker refuses both architectures and archMap
    arches = {a["architecture"]: a["subArchitectures"] for a in p["archMap"]}
    assert arches == {"SCMP_ARCH_X86_64": ["SCMP_ARCH_X86"], "SCMP_ARCH_AARCH64": []}


def allowed_anyhow() -> set[str]:
    """Names some ALLOW rule lists (with or without conditions)."""
    return {n for r in loaded()["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}


def test_io_uring_and_the_deny_set_are_never_allowed():
    allowed = allowed_anyhow()
    assert not IO_URING & allowed
    assert not DOCKER_DOCUMENTED & allowed, DOCKER_DOCUMENTED & allowed
    assert not set(seccomp.DENIED) & allowed
    assert "socketcall" not in allowed  # would bypass the socket rule on 32-bit x86


def test_the_allowlist_covers_the_hosts_syscall_table_but_the_deny_set():
    listed = set(seccomp.X86_64_SYSCALLS)
    if HEADER.is_file():  # the literal list is this header's (Debian 12)
        import re

        names = set(re.findall(r"#define __NR_(\w+)\s", HEADER.read_text()))
        assert names <= listed, names - listed
    allowed = allowed_anyhow() | {"clone3"}  # clone3 answers ENOSYS on purpose
    missing = listed - allowed - set(seccomp.DENIED)
    assert not missing, missing
    for name in ("read", "openat", "execve", "futex", "epoll_wait", "mmap", "rseq", "statx", "ptrace", "chroot",
                 "setresuid", "pidfd_open", "seccomp", "landlock_create_ruleset", "_llseek", "mmap2", "fchmodat2"):
        assert name in allowed, name


def test_socket_allows_every_family_but_af_vsock_even_with_high_bits():
    for family in range(64):
        want = "SCMP_ACT_ERRNO" if family == seccomp.AF_VSOCK else "SCMP_ACT_ALLOW"
        assert action("socket", family)[0] == want, family
    # the kernel reads the family as an int: the upper 32 bits must not smuggle 40 through
    assert action("socket", (1 << 32) | 40)[0] == "SCMP_ACT_ERRNO"
    assert action("socket", MASK64 & ~0xFF | 40)[0] == "SCMP_ACT_ERRNO"
    for r in rules_for("socket"):
        assert r["action"] == "SCMP_ACT_ALLOW" and len(r["args"]) == 1


def test_clone_refuses_namespace_flags_and_clone3_answers_enosys():
    (rule,) = rules_for("clone")
    assert rule["args"] == [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    sigchld, threads = 17, 0x3D0F00  # fork(), pthread_create's flags
    assert action("clone", sigchld)[0] == action("clone", threads)[0] == "SCMP_ACT_ALLOW"
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert action("clone", threads | flag) == ("SCMP_ACT_ERRNO", 1), hex(flag)
    assert action("clone3", 0) == ("SCMP_ACT_ERRNO", 38)


# i386's multiplexers and the calls libseccomp routes through them (as socketcall(SYS_x) /
# ipc(x) rules whose argument 0 is the sub-call: the rule's own argument-0 check is lost)
I386_MULTIPLEXED = {
    "socketcall": {"socket", "bind", "connect", "listen", "accept", "getsockname", "getpeername", "socketpair",
                   "send", "recv", "sendto", "recvfrom", "shutdown", "setsockopt", "getsockopt", "sendmsg",
                   "recvmsg", "accept4", "recvmmsg", "sendmmsg"},
    "ipc": {"semop", "semget", "semctl", "semtimedop", "msgsnd", "msgrcv", "msgget", "msgctl", "shmat", "shmdt",
            "shmget", "shmctl"},
}


def test_the_only_foreign_abi_is_i386_and_its_socket_multiplexer_is_refused_outright():
    """i386 ``socketcall(SYS_SOCKET, {40, ...})`` opened AF_VSOCK: libseccomp had turned the
    ``socket`` family rules into ``socketcall(SYS_SOCKET)`` for any family. A multiplexer of a
    call with argument rules needs its own rule, without conditions (it supersedes the derived
    ones) and not with the default action (such a rule is dropped)."""
    p = loaded()
    arches = {a["architecture"]: a["subArchitectures"] for a in p["archMap"]}
    assert arches == {"SCMP_ARCH_X86_64": ["SCMP_ARCH_X86"], "SCMP_ARCH_AARCH64": []}  # no x32, no 32-bit arm
    ruled = {n for r in p["syscalls"] if r.get("args") for n in r["names"]}
    assert ruled & I386_MULTIPLEXED["socketcall"] == {"socket"}
    assert not ruled & I386_MULTIPLEXED["ipc"]  # else `ipc` needs a rule like socketcall's
    for mux, calls in I386_MULTIPLEXED.items():
        if ruled & calls:
            (rule,) = rules_for(mux)
            assert "args" not in rule and rule["action"] == "SCMP_ACT_ERRNO", rule
            assert rule["errnoRet"] not in (None, p["defaultErrnoRet"]), rule
    for call in range(1, 21):  # SYS_SOCKET .. SYS_SENDMMSG
        assert action("socketcall", call) == ("SCMP_ACT_ERRNO", seccomp.ENOSYS), call
    assert "socketcall" in seccomp.DENIED and "socketcall" not in allowed_anyhow()


def test_personality_only_for_dockers_values():
    for v in (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert action("personality", v)[0] == "SCMP_ACT_ALLOW", hex(v)
    for v in (0x40000, 0x0400000, 0x1):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...
        assert action("personality", v)[0] == "SCMP_ACT_ERRNO", hex(v)


def test_every_container_gets_the_profile_and_no_new_privileges_as_before():
    opts = {}
    for label, spec in {
        "workload": SandboxSpec(SANDBOX_IMAGE, prof(), [0]),
        "root": SandboxSpec(SANDBOX_IMAGE, prof(), [0], user="0:0", writable_root=True, caps=ROOT_CAPS),
        "service": SandboxSpec(SANDBOX_IMAGE, prof(), [0], command=[], caps=ROOT_CAPS),
    }.items():
        opts[label] = DockerSandbox(None, spec)._run_kwargs({})["security_opt"]
    sec = seccomp.security_opt()
    assert opts["workload"] == [sec, "no-new-privileges"]
    assert opts["root"] == [sec]  # a root workload keeps ROOT_CAPS across execve
    assert opts["service"] == [sec, "no-new-privileges"]


# --------------------------------------------------------------------------- real containers

PROBE = r"""
import ctypes, errno, json, os, socket, sqlite3, subprocess, sys, tarfile, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(x) for x in a))
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
res = {"seccomp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]}
out = []
ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
res["threads"] = len(out)
res["subprocess"] = subprocess.run(["sh", "-c", "echo hi"], capture_output=True, text=True).stdout.strip()
pid = os.fork()
if pid == 0:
    os._exit(7)
res["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
db = sqlite3.connect(os.path.join(sys.argv[1], "t.db"))
db.execute("PRAGMA journal_mode=WAL"); db.execute("CREATE TABLE t(a)"); db.execute("INSERT INTO t VALUES (1)"); db.commit()
res["sqlite"] = db.execute("SELECT count(*) FROM t").fetchone()[0]
d = sys.argv[1]
open(os.path.join(d, "f.txt"), "w").write("x" * 1000)
res["tar"] = subprocess.run(["sh", "-c", f"cd {d} && tar -czf a.tgz f.txt && mkdir -p x && tar -xzf a.tgz -C x && cat x/f.txt | wc -c"],
                            capture_output=True, text=True).stdout.strip()
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname(), timeout=5); conn, _ = srv.accept()
cli.sendall(b"ping"); res["tcp"] = conn.recv(4).decode()
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); u.close()
res["ipv6"] = sc(41, socket.AF_INET6, socket.SOCK_STREAM, 0)
for cmd in (["unshare", "-U", "true"], ["unshare", "-n", "true"], ["unshare", "-m", "true"],
            ["mount", "-t", "tmpfs", "none", d]):
    p = subprocess.run(cmd, capture_output=True, text=True)
    res[" ".join(cmd[:2])] = [p.returncode, p.stderr.strip()[-120:]]
res["unshare(NEWUSER)"] = sc(272, 0x10000000)
res["clone(NEWUSER)"] = sc(56, 0x10000000 | 17, 0, 0, 0, 0)
res["io_uring_setup"] = sc(425, 8, ctypes.addressof(ctypes.create_string_buffer(120)))
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); res["vsock"] = "opened"
except OSError as e:
    res["vsock"] = errno.errorcode[e.errno]
res["vsock_hi32"] = sc(41, (1 << 32) | 40, socket.SOCK_STREAM, 0) if os.uname().machine == "x86_64" else "EPERM"
res["uid"] = os.getuid()
print(json.dumps(res))
"""


def _probe(sb: DockerSandbox, workdir: str) -> dict:
    r = sb.exec(["python3", "-c", PROBE, workdir], timeout=60)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def _check_workload_works_and_the_kernel_surface_is_refused(res: dict) -> None:
    assert res["seccomp"] == "2"  # a filter is on (Docker's default would be too: see io_uring below)
    assert res["threads"] == 8 and res["subprocess"] == "hi" and res["fork"] == 7
    assert res["sqlite"] == 1 and res["tar"] == "1000" and res["tcp"] == "ping" and res["ipv6"] == "ok"
    for cmd in ("unshare -U", "unshare -n", "unshare -m", "mount -t"):
        assert res[cmd][0] != 0, (cmd, res[cmd])
    assert res["unshare(NEWUSER)"] == "EPERM" and res["clone(NEWUSER)"] == "EPERM"
    assert res["io_uring_setup"] == "EPERM"  # Docker 20.10's default profile allows it
    assert res["vsock"] in ("EPERM", "EAFNOSUPPORT") and res["vsock_hi32"] in ("EPERM", "EAFNOSUPPORT")


@pytest.mark.docker
def test_an_unprivileged_workload_runs_and_the_refused_calls_fail(docker_client, trial_cpu):
    with DockerSandbox(docker_client, SandboxSpec(SANDBOX_IMAGE, prof(), trial_cpu)) as sb:
        opts = docker_client.api.inspect_container(sb.container.id)["HostConfig"]["SecurityOpt"]
        assert any(o.startswith("seccomp=") and '"io_uring_setup"' not in o for o in opts), opts
        assert "no-new-privileges" in opts
        res = _probe(sb, "/work")
    assert res["uid"] == 10001
    _check_workload_works_and_the_kernel_surface_is_refused(res)


@pytest.mark.docker
def test_a_root_workload_with_root_caps_runs_under_the_profile(docker_client, trial_cpu):
    spec = SandboxSpec(SANDBOX_IMAGE, prof(), trial_cpu, user="0:0", writable_root=True, caps=ROOT_CAPS)
    with DockerSandbox(docker_client, spec) as sb:
        res = _probe(sb, "/root")
        # ROOT_CAPS still work: chown to another user, write a root-owned file
        script = "touch /etc/harness-x && chown 10001:10001 /etc/harness-x && stat -c %u /etc/harness-x && apt-get --version | head -1"
        r = sb.exec(["sh", "-c", script], timeout=30)
    assert res["uid"] == 0
    _check_workload_works_and_the_kernel_surface_is_refused(res)
    assert r.exit_code == 0 and r.stdout.splitlines()[0] == "10001", (r.stdout, r.stderr)
    assert r.stdout.splitlines()[1].startswith("apt ")


# The i386 ABI from a 64-bit process: `int 0x80` (the filter sees AUDIT_ARCH_I386, as for a
# 32-bit binary) through a stub in executable memory, pointers in a MAP_32BIT page; each call
# in a forked child, so a filter that kills the caller only takes the child.
PROBE32 = r"""
import ctypes, errno, json, mmap, os, signal, socket, struct, threading
STUB = bytes.fromhex("5355" "89f8" "4889f3" "4989d2" "4889ca" "4c89d1" "4c89c6" "4c89cf" "488b6c2418" "cd80" "4863c0" "5d5b" "c3")
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC); code.write(STUB)
low = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | 0x40, prot=mmap.PROT_READ | mmap.PROT_WRITE)  # MAP_32BIT
base = ctypes.addressof(ctypes.c_char.from_buffer(low)); assert base < 1 << 32
int80 = ctypes.CFUNCTYPE(ctypes.c_long, *[ctypes.c_long] * 7)(ctypes.addressof(ctypes.c_char.from_buffer(code)))
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
def put(off, data):
    low[off:off + len(data)] = data
    return base + off
def raw(nr, a, abi):
    if abi == "i386":
        return int80(nr, *a, *[0] * (6 - len(a)))
    rc = libc.syscall(*(ctypes.c_long(x) for x in (nr, *a)))
    return -ctypes.get_errno() if rc < 0 else rc
def call(nr, *a, abi="i386"):
    r, w = os.pipe(); pid = os.fork()
    if pid == 0:
        rc = raw(nr, a, abi)
        if rc == 0 and nr in (120, 56):
            os._exit(0)  # the clone's own child
        out = "ok" if rc >= 0 else errno.errorcode.get(-rc, str(-rc))
        if rc >= 0 and nr in (102, 359, 41):
            out += ":%d" % socket.socket(fileno=rc).getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        os.write(w, out.encode()); os._exit(0)
    os.close(w); out = os.read(r, 100).decode(); os.close(r)
    st = os.waitpid(pid, 0)[1]
    return "killed:" + signal.Signals(os.WTERMSIG(st)).name if os.WIFSIGNALED(st) else out
NS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
res = {"getpid": call(20)}
res["socketcall"] = {n: call(102, n, put(0, struct.pack("<6I", 40, 1, 0, 0, 0, 0))) for n in range(1, 21)}
res["socket_vsock"] = [call(359, 40, t, 0) for t in (1, 2, 5)] + [call(359, (1 << 32) | 40, 1, 0)]
# i386 `socket` answers as x86_64's for every family and type but the fd numbers
res["socket_differs"] = {f"{f}/{t}": (call(359, f, t, 0), call(41, f, t, 0, abi="x86_64"))
                         for f in range(64) for t in (1, 2, 3, 5)}
res["socket_differs"] = {k: v for k, v in res["socket_differs"].items() if v[0] != v[1]}
res["inet"] = call(359, 2, 1, 0)
res["io_uring"] = [call(425, 8, put(64, bytes(120))), call(426, 0xFFFFFFFF, 0, 0, 0, 0, 0), call(427, 0xFFFFFFFF, 0, 0, 0)]
res["unshare"] = sorted({call(310, f) for f in NS})
res["setns"] = call(346, 0, 0x10000000)
res["clone_ns"] = sorted({call(120, f | 17, 0, 0, 0, 0) for f in NS} | {call(120, (1 << 32) | 0x10000000 | 17, 0, 0, 0, 0)})
res["clone"] = call(120, 17, 0, 0, 0, 0)
res["clone3"] = call(435, put(256, bytes(88)), 88)
res["x32"] = [call(0x40000000 | 41, 40, 1, 0, abi="x86_64"), call(0x40000000 | 39, abi="x86_64")]
print(json.dumps(res))
"""


def _probe32(sb: DockerSandbox) -> dict:
    r = sb.exec(["python3", "-c", PROBE32], timeout=120)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


@pytest.mark.docker
def test_the_i386_abi_reaches_neither_vsock_nor_io_uring_nor_namespaces(docker_client, trial_cpu):
    """Measured before the fix: i386 socketcall(SYS_SOCKET, {40, 1, 0}) opened AF_VSOCK
    (SO_DOMAIN 40) and every other socketcall sub-call was allowed; the direct i386 calls
    were already refused."""
    if (r := docker_client.info().get("Architecture")) != "x86_64":
        pytest.skip(f"int 0x80 is x86 only (engine on {r})")
    with DockerSandbox(docker_client, SandboxSpec(SANDBOX_IMAGE, prof(), trial_cpu)) as sb:
        res = _probe32(sb)
    assert res["getpid"] == "ok" and res["inet"] == "ok:2" and res["clone"] == "ok"  # the ABI works: the filter refuses
    assert set(res["socketcall"].values()) == {"ENOSYS"}, res["socketcall"]  # every sub-call, SYS_SOCKET first
    assert res["socket_vsock"] == ["EPERM"] * 4
    assert res["socket_differs"] == {}, res["socket_differs"]
    assert res["io_uring"] == ["EPERM"] * 3  # enter on fd -1 would say EBADF if reachable
    assert res["unshare"] == ["EPERM"] and res["setns"] == "EPERM" and res["clone_ns"] == ["EPERM"]
    assert res["clone3"] == "ENOSYS"
    assert res["x32"] == ["killed:SIGSYS"] * 2  # x32 is not in the filter: it kills the caller


@pytest.mark.docker
def test_the_probe_sees_the_hole_when_the_socketcall_rule_is_missing(docker_client, trial_cpu):
    """The profile as it was (no socketcall rule): the same probe opens AF_VSOCK through i386
    socketcall, so the refusals above are the rule's doing."""
    if docker_client.info().get("Architecture") != "x86_64":
        pytest.skip("int 0x80 is x86 only")
    old = seccomp.profile()
    old["syscalls"] = [r for r in old["syscalls"] if r["names"] != ["socketcall"]]
    out = docker_client.containers.run(
        SANDBOX_IMAGE, ["python3", "-c", PROBE32], remove=True, network_mode="none", user="10001:10001",
        cap_drop=["ALL"], security_opt=["seccomp=" + json.dumps(old), "no-new-privileges"], cpuset_cpus=",".join(map(str, trial_cpu)),
    )
    res = json.loads(out)
    assert res["socketcall"]["1"] == "ok:40", res["socketcall"]  # an AF_VSOCK socket
    assert res["socket_vsock"] == ["EPERM"] * 4 and res["io_uring"] == ["EPERM"] * 3


WORKLOADS = {
    PYTHON_IMAGE: "pip --version && python3 -c 'import ssl, sqlite3, hashlib, multiprocessing as m; "
                  "print(m.Pool(2).map(abs, [-1, -2]))' && tar --version | head -1",
}


@pytest.mark.docker
@pytest.mark.parametrize("image", list(WORKLOADS))
def test_other_images_workloads_run_under_the_profile(docker_client, trial_cpu, image):
    """pip, a process pool, ssl/sqlite in the harness's python image (node 18 was checked by hand:
    an http server, fs and a child process run as under Docker's default profile)."""
    from harness.sandbox.docker_sandbox import image_present

    if not image_present(docker_client, image):
        missing(f"image {image} missing; run `make images`")
    with DockerSandbox(docker_client, SandboxSpec(image, prof(), trial_cpu)) as sb:
        r = sb.exec(["sh", "-c", WORKLOADS[image]], timeout=60)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("pip ") and "[1, 2]" in r.stdout, r.stdout
