"""The seccomp profile every harness container runs under: Docker's default, tightened.

Built here (not copied from moby's ``default.json``) the way Docker's default is built: the
default action refuses every syscall with EPERM, and an explicit allowlist names the
syscalls an ordinary unprivileged workload uses (the x86_64 table of Linux 6.1, which
aarch64's generic table is a subset of, the 32-bit x86 names for i386 processes, and a few
newer syscalls). The engine takes the profile's *content* in ``SecurityOpt`` as
``seccomp=<json>`` (what ``docker run --security-opt seccomp=FILE`` sends), for the
workload sandboxes, the services and the helper containers alike.

Refused (the deny set, :data:`DENIED`, each with its reason):

- what Docker's documentation lists as blocked by its default profile: kernel modules,
  kexec, reboot, swap, clocks, quotas, the kernel keyring, accounting, BPF and perf events,
  NUMA memory policy, ``mount``/``umount``/``pivot_root`` and the new mount API
  (``fsopen`` … ``mount_setattr``), ``setns``/``unshare``, file handles
  (``open_by_handle_at``, the "shocker" escape), cross-process memory
  (``process_vm_readv/writev``), ``kcmp``, ``userfaultfd``, ``iopl``/``ioperm``, ``vm86``
  and obsolete calls (``uselib``, ``ustat``, ``sysfs``, ``_sysctl``, …);
- **io_uring** (``io_uring_setup/enter/register``): a large, fast-moving kernel attack
  surface (a steady source of privilege escalations) that also performs I/O outside the
  syscalls this profile filters; no workload here needs it, and libraries that use it fall
  back when it is refused. Docker 20.10's default still allows it;
- ``syslog`` (the host's kernel log, readable when ``kernel.dmesg_restrict`` is 0), and the
  newer members of refused families (``quotactl_fd``, ``set_mempolicy_home_node``,
  ``migrate_pages``, ``open_tree_attr``, ``listmount``/``statmount``);
- ``socketcall`` (32-bit x86's socket multiplexer, whose arguments a filter cannot see):
  see *Foreign ABIs* below.

Argument rules (:data:`RULES`):

- ``socket`` is allowed for every address family but **AF_VSOCK** (40), which gets the
  default EPERM. Network mode ``none`` leaves vsock open: on a VM it reaches the
  hypervisor host (CID 2) and other guests. The family is an ``int``: the kernel drops the
  upper 32 bits of the register, so a plain ``SCMP_CMP_NE 40`` lets ``(1 << 32) | 40``
  through (measured: it opens a vsock socket). The allow rules therefore match only
  values with the upper 32 bits clear: ``< 40``, and ``41``, ``42-43``, ``44-47``,
  ``48-63`` as ``SCMP_CMP_MASKED_EQ`` bit prefixes (Linux has 46 families). A separate
  EAFNOSUPPORT rule for 40 is not possible: runc's libseccomp (2.5) refuses a second
  action on ``socket``'s argument tree ("file exists");
- ``clone`` is allowed only without the namespace flags (``CLONE_NEWNS``,
  ``NEWCGROUP``, ``NEWUTS``, ``NEWIPC``, ``NEWUSER``, ``NEWPID``, ``NEWNET``: mask
  0x7E020000 must be 0); ``clone3`` passes its flags in memory a filter cannot read, so it
  answers ENOSYS and glibc falls back to ``clone``;
- ``personality`` only for the values Docker allows (Linux, 32-bit, ``UNAME26`` and
  the query 0xffffffff).

Foreign ABIs (:data:`ARCH_MAP`): on x86_64 the filter also covers the i386 ABI
(``SCMP_ARCH_X86``: ``int 0x80``, and 32-bit binaries), under the same rules; x32 and, on
aarch64, 32-bit arm are *not* covered, so the filter kills the thread (SIGSYS, the
default bad-architecture action of libseccomp under runc) that makes a syscall through
them. Measured (Linux 6.18, runc 1.1.5, libseccomp 2.5.4), from a 64-bit process with
``int 0x80`` (``tests/test_seccomp.py``, hostile task ``vsock32``):

- **Found**: i386 ``socketcall(SYS_SOCKET, {40, 1, 0})`` returned an AF_VSOCK socket
  (``SO_DOMAIN`` 40), although ``socketcall`` is in the deny set. libseccomp adds, for each
  rule on a socket syscall (``socket``, ``connect``, …), a rule on i386's ``socketcall``
  with argument 0 = that sub-call, and *replaces* the rule's own argument-0 comparison
  (the family) with it: the ``socket`` allow rules became ``socketcall(SYS_SOCKET)`` for
  any family, and every other sub-call was allowed the same way. (Direct i386 ``socket``,
  syscall 359, was refused for family 40; io_uring, ``unshare`` and ``clone`` with
  namespace flags were refused on i386 too.)
- **Fix**: ``socketcall`` gets an unconditional ``ENOSYS`` rule (:data:`RULES`). A rule
  without argument conditions supersedes libseccomp's conditional ones for the same
  syscall, in either order: every ``socketcall`` sub-call (1-20) now answers ENOSYS. Its
  errno must differ from the default EPERM: a rule with the default action is dropped
  (measured: an EPERM ``socketcall`` rule left the hole open), and a ``socketcall`` rule
  with conditions collides with the generated ones (runc refuses the profile: "file
  exists"). i386 programs keep working through the direct socket syscalls (359-373, the
  same family rule as on x86_64: measured identical answers for families 0-63); a 32-bit
  glibc that still multiplexes through ``socketcall`` (built for kernels < 4.3) gets ENOSYS
  from ``socket()``.
- x32 (``CONFIG_X86_X32_ABI`` is off on this kernel) and 32-bit arm were dropped from the
  filter: nothing can be measured there, so they fail closed (an x32 ``socket`` call now
  dies with SIGSYS instead of EPERM). Dropping i386 as well was measured and not needed:
  every ``int 0x80`` call, even ``getpid``, then kills its thread (SIGSYS: a
  single-threaded process dies, a threaded one loses that thread; core limit 0, no core
  file), so no 32-bit binary would run.

``ptrace`` stays allowed (as in Docker's default on kernels >= 4.8, where it cannot be used
to skip a seccomp check); the containers have no ``CAP_SYS_PTRACE``, and the keeper runs
under another uid. Calls the kernel guards by a capability the containers lack (``chroot``,
``sethostname``, ``mknod``, ``setuid``) stay allowed and are refused by the kernel.

Names unknown to the host's libseccomp (runc's) are ignored by the engine, so the lists can
name syscalls newer than the host; runc answers ENOSYS (not EPERM) for syscall numbers
above the highest one the filter knows, so glibc's fallbacks for new syscalls still work.
"""

from __future__ import annotations

import functools
import json

EPERM, ENOSYS = 1, 38
AF_VSOCK = 40
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS = 0x7E020000
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# Linux's x86_64 syscall table, in number order (0..450), as in
# /usr/include/x86_64-linux-gnu/asm/unistd_64.h (linux-libc-dev 6.1, Debian 12). aarch64 uses
# the generic table, whose 64-bit names are all in this one.
X86_64_SYSCALLS = (
    "read", "write", "open", "close", "stat", "fstat", "lstat", "poll", "lseek", "mmap", "mprotect",
    "munmap", "brk", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "ioctl", "pread64", "pwrite64",
    "readv", "writev", "access", "pipe", "select", "sched_yield", "mremap", "msync", "mincore",
    "madvise", "shmget", "shmat", "shmctl", "dup", "dup2", "pause", "nanosleep", "getitimer", "alarm",
    "setitimer", "getpid", "sendfile", "socket", "connect", "accept", "sendto", "recvfrom", "sendmsg",
    "recvmsg", "shutdown", "bind", "listen", "getsockname", "getpeername", "socketpair", "setsockopt",
    "getsockopt", "clone", "fork", "vfork", "execve", "exit", "wait4", "kill", "uname", "semget",
    "semop", "semctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "fcntl", "flock", "fsync",
    "fdatasync", "truncate", "ftruncate", "getdents", "getcwd", "chdir", "fchdir", "rename", "mkdir",
    "rmdir", "creat", "link", "unlink", "symlink", "readlink", "chmod", "fchmod", "chown", "fchown",
    "lchown", "umask", "gettimeofday", "getrlimit", "getrusage", "sysinfo", "times", "ptrace", "getuid",
    "syslog", "getgid", "setuid", "setgid", "geteuid", "getegid", "setpgid", "getppid", "getpgrp",
    "setsid", "setreuid", "setregid", "getgroups", "setgroups", "setresuid", "getresuid", "setresgid",
    "getresgid", "getpgid", "setfsuid", "setfsgid", "getsid", "capget", "capset", "rt_sigpending",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_sigsuspend", "sigaltstack", "utime", "mknod", "uselib",
    "personality", "ustat", "statfs", "fstatfs", "sysfs", "getpriority", "setpriority",
    "sched_setparam", "sched_getparam", "sched_setscheduler", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "mlock", "munlock",
    "mlockall", "munlockall", "vhangup", "modify_ldt", "pivot_root", "_sysctl", "prctl", "arch_prctl",
    "adjtimex", "setrlimit", "chroot", "sync", "acct", "settimeofday", "mount", "umount2", "swapon",
    "swapoff", "reboot", "sethostname", "setdomainname", "iopl", "ioperm", "create_module",
    "init_module", "delete_module", "get_kernel_syms", "query_module", "quotactl", "nfsservctl",
    "getpmsg", "putpmsg", "afs_syscall", "tuxcall", "security", "gettid", "readahead", "setxattr",
    "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
    "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "tkill", "time", "futex",
    "sched_setaffinity", "sched_getaffinity", "set_thread_area", "io_setup", "io_destroy",
    "io_getevents", "io_submit", "io_cancel", "get_thread_area", "lookup_dcookie", "epoll_create",
    "epoll_ctl_old", "epoll_wait_old", "remap_file_pages", "getdents64", "set_tid_address",
    "restart_syscall", "semtimedop", "fadvise64", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "clock_settime", "clock_gettime", "clock_getres",
    "clock_nanosleep", "exit_group", "epoll_wait", "epoll_ctl", "tgkill", "utimes", "vserver", "mbind",
    "set_mempolicy", "get_mempolicy", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr", "kexec_load", "waitid", "add_key", "request_key", "keyctl",
    "ioprio_set", "ioprio_get", "inotify_init", "inotify_add_watch", "inotify_rm_watch",
    "migrate_pages", "openat", "mkdirat", "mknodat", "fchownat", "futimesat", "newfstatat", "unlinkat",
    "renameat", "linkat", "symlinkat", "readlinkat", "fchmodat", "faccessat", "pselect6", "ppoll",
    "unshare", "set_robust_list", "get_robust_list", "splice", "tee", "sync_file_range", "vmsplice",
    "move_pages", "utimensat", "epoll_pwait", "signalfd", "timerfd_create", "eventfd", "fallocate",
    "timerfd_settime", "timerfd_gettime", "accept4", "signalfd4", "eventfd2", "epoll_create1", "dup3",
    "pipe2", "inotify_init1", "preadv", "pwritev", "rt_tgsigqueueinfo", "perf_event_open", "recvmmsg",
    "fanotify_init", "fanotify_mark", "prlimit64", "name_to_handle_at", "open_by_handle_at",
    "clock_adjtime", "syncfs", "sendmmsg", "setns", "getcpu", "process_vm_readv", "process_vm_writev",
    "kcmp", "finit_module", "sched_setattr", "sched_getattr", "renameat2", "seccomp", "getrandom",
    "memfd_create", "kexec_file_load", "bpf", "execveat", "userfaultfd", "membarrier", "mlock2",
    "copy_file_range", "preadv2", "pwritev2", "pkey_mprotect", "pkey_alloc", "pkey_free", "statx",
    "io_pgetevents", "rseq", "pidfd_send_signal", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "pidfd_open", "clone3", "close_range", "openat2", "pidfd_getfd", "faccessat2", "process_madvise",
    "epoll_pwait2", "mount_setattr", "quotactl_fd", "landlock_create_ruleset", "landlock_add_rule",
    "landlock_restrict_self", "memfd_secret", "process_mrelease", "futex_waitv",
    "set_mempolicy_home_node",
)

# Names of the 32-bit tables (x86 from asm/unistd_32.h, and the generic 32-bit names) that the
# x86_64 table lacks: an i386 process needs them (ARCH_MAP covers i386 only).
COMPAT_32_SYSCALLS = (
    "sync_file_range2", "clock_gettime64", "clock_settime64", "clock_adjtime64", "clock_getres_time64",
    "clock_nanosleep_time64", "timer_gettime64", "timer_settime64", "timerfd_gettime64",
    "timerfd_settime64", "utimensat_time64", "pselect6_time64", "ppoll_time64", "io_pgetevents_time64",
    "recvmmsg_time64", "mq_timedsend_time64", "mq_timedreceive_time64", "semtimedop_time64",
    "rt_sigtimedwait_time64", "futex_time64", "sched_rr_get_interval_time64", "fcntl64", "statfs64",
    "fstatfs64", "truncate64", "ftruncate64", "sendfile64", "fstatat64", "fstat64", "mmap2",
    "fadvise64_64", "stat64", "lstat64", "waitpid", "break", "oldstat", "umount", "stime", "oldfstat",
    "stty", "gtty", "nice", "ftime", "prof", "signal", "lock", "mpx", "ulimit", "oldolduname",
    "sigaction", "sgetmask", "ssetmask", "sigsuspend", "sigpending", "oldlstat", "readdir", "profil",
    "socketcall", "olduname", "idle", "vm86old", "ipc", "sigreturn", "sigprocmask", "bdflush",
    "_llseek", "_newselect", "vm86", "ugetrlimit", "lchown32", "getuid32", "getgid32", "geteuid32",
    "getegid32", "setreuid32", "setregid32", "getgroups32", "setgroups32", "fchown32", "setresuid32",
    "getresuid32", "setresgid32", "getresgid32", "chown32", "setuid32", "setgid32", "setfsuid32",
    "setfsgid32",
)

# Syscalls after Linux 6.1 (the host's headers): allowed where the host's libseccomp knows
# them, ignored where it does not (runc then answers ENOSYS and glibc falls back).
NEWER_SYSCALLS = (
    "cachestat", "fchmodat2", "map_shadow_stack", "futex_wake", "futex_wait", "futex_requeue",
    "mseal", "setxattrat", "getxattrat", "listxattrat", "removexattrat", "file_getattr", "file_setattr",
    "lsm_get_self_attr", "lsm_list_modules",
    # refused below (DENIED): listed so the deny set names them
    "open_tree_attr", "listmount", "statmount",
)

_DOCKER_DOCUMENTED = "blocked by Docker's default profile (Docker's seccomp documentation)"
_MOUNT_API = "the new mount API (Docker's default refuses it with mount)"
_UNIMPLEMENTED = "not implemented by Linux (or removed): nothing calls it"

# name -> why it is refused
DENIED: dict[str, str] = {
    **dict.fromkeys((
        "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
        "finit_module", "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp",
        "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mbind", "mount", "move_pages",
        "name_to_handle_at", "nfsservctl", "open_by_handle_at", "perf_event_open", "pivot_root",
        "process_vm_readv", "process_vm_writev", "query_module", "quotactl", "reboot", "request_key",
        "set_mempolicy", "setns", "settimeofday", "stime", "swapon", "swapoff", "sysfs", "_sysctl",
        "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86", "vm86old",
    ), _DOCKER_DOCUMENTED),
    **dict.fromkeys(("fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
                     "open_tree_attr"), _MOUNT_API),
    **dict.fromkeys(("listmount", "statmount"), "mount-table queries of the new mount API, with the rest of it"),
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"),
                    "io_uring: a large kernel attack surface doing I/O outside the filtered syscalls; "
                    "callers fall back when it is refused"),
    "syslog": "reads the host's kernel log where kernel.dmesg_restrict is 0 (Docker allows it only with CAP_SYSLOG)",
    "clock_settime64": "sets the host's clock (32-bit clock_settime)",
    "clock_adjtime64": "adjusts the host's clock (32-bit clock_adjtime)",
    "quotactl_fd": "quotactl by file descriptor (quotactl is refused)",
    "set_mempolicy_home_node": "NUMA memory policy (set_mempolicy and mbind are refused)",
    "migrate_pages": "NUMA page migration of another process (move_pages is refused)",
    "socketcall": "32-bit x86 socket multiplexer: its arguments are out of a filter's reach, and "
                  "libseccomp turns the socket rules into socketcall(SYS_SOCKET) for any family "
                  "(answers ENOSYS, see RULES)",
    "bdflush": "obsolete (a no-op that needs CAP_SYS_ADMIN)",
    **dict.fromkeys(("afs_syscall", "tuxcall", "security", "vserver", "getpmsg", "putpmsg", "epoll_ctl_old",
                     "epoll_wait_old", "break", "stty", "gtty", "ftime", "prof", "profil", "lock", "mpx",
                     "ulimit", "idle"), _UNIMPLEMENTED),
}

# Allowed only under the argument rules of RULES (so never in the plain allowlist).
RULED = ("socket", "clone", "clone3", "personality")
# Foreign ABIs the filter covers, per native architecture (the rest is killed by the filter).
SUB_ARCHITECTURES = {"SCMP_ARCH_X86_64": ["SCMP_ARCH_X86"], "SCMP_ARCH_AARCH64": []}


def allowed_names() -> list[str]:
    """The syscalls the profile allows without conditions."""
    names = dict.fromkeys(X86_64_SYSCALLS + COMPAT_32_SYSCALLS + NEWER_SYSCALLS)
    return sorted(n for n in names if n not in DENIED and n not in RULED)


def _arg(index: int, value: int, op: str, value_two: int = 0) -> dict:
    return {"index": index, "value": value, "valueTwo": value_two, "op": op}


_ALL64 = 0xFFFFFFFFFFFFFFFF

# socket(family, ...): the families other than AF_VSOCK, each with the upper 32 bits clear
# (0..39; 41; 42-43; 44-47; 48-63: Linux has 46 families, a larger one is refused anyway)
_SOCKET_ALLOWED = [
    [_arg(0, AF_VSOCK, "SCMP_CMP_LT")],
    [_arg(0, _ALL64, "SCMP_CMP_MASKED_EQ", 41)],
    [_arg(0, _ALL64 ^ 0x1, "SCMP_CMP_MASKED_EQ", 42)],
    [_arg(0, _ALL64 ^ 0x3, "SCMP_CMP_MASKED_EQ", 44)],
    [_arg(0, _ALL64 ^ 0xF, "SCMP_CMP_MASKED_EQ", 48)],
]

RULES: list[dict] = [
    *({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": args,
       "comment": "every address family but AF_VSOCK (40, refused with EPERM), upper 32 bits clear"} for args in _SOCKET_ALLOWED),
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
     "args": [_arg(0, CLONE_NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ", 0)],
     "comment": "no new namespaces (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET)"},
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS,
     "comment": "its flags are out of the filter's reach: ENOSYS makes glibc fall back to clone"},
    # Unconditional, and not the default EPERM (a rule with the default action is dropped):
    # it supersedes the socketcall(SYS_*) rules libseccomp derives from the socket rules for
    # i386, which lose the family check (socketcall(SYS_SOCKET, {40, ...}) opened AF_VSOCK).
    {"names": ["socketcall"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS,
     "comment": "i386 socket multiplexer (arguments out of reach): every sub-call refused; the direct socket syscalls work"},
    *({"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, v, "SCMP_CMP_EQ")],
       "comment": "Linux, 32-bit, UNAME26 and the query only"} for v in PERSONALITIES),
]

ARCH_MAP = [{"architecture": arch, "subArchitectures": subs} for arch, subs in SUB_ARCHITECTURES.items()]


def profile() -> dict:
    """The profile as a dict (Docker's seccomp JSON format)."""
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "archMap": ARCH_MAP,
        "syscalls": [
            {"names": allowed_names(), "action": "SCMP_ACT_ALLOW",
             "comment": "an unprivileged workload's syscalls, less the deny set (harness.sandbox.seccomp.DENIED)"},
            *RULES,
        ],
    }


@functools.lru_cache(maxsize=1)
def profile_json() -> str:
    """The profile as the JSON the engine takes in ``SecurityOpt`` (``seccomp=<json>``)."""
    return json.dumps(profile(), separators=(",", ":"))


def security_opt() -> str:
    """The ``security_opt`` entry that applies the profile to a container."""
    return "seccomp=" + profile_json()
