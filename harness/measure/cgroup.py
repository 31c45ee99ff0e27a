"""Find a container's cgroup from the host and read its saturation counters.

Works on cgroup v1 (legacy), v1 hybrid (v1 controllers plus a cgroup2 mount at
``/sys/fs/cgroup/unified`` that carries per-cgroup PSI) and v2 (unified). Two layers:

* Pure parsers, one per kernel file format, taking text and returning plain values:
  :func:`parse_proc_cgroup`, :func:`parse_mountinfo`, :func:`parse_flat_keyed`,
  :func:`parse_psi`, :func:`parse_cpu_max`, :func:`parse_max_value`,
  :func:`parse_v1_bytes_limit`, :func:`parse_v1_quota`, :func:`parse_cpuset`.
* Small filesystem readers that take their roots as arguments so tests can point them
  at recorded trees: :func:`locate`, :func:`read_limits`, :class:`SnapshotReader` /
  :func:`read_snapshot`, :func:`detect_cgroup_version`.

Roots. ``proc_root`` is where ``<pid>/cgroup`` and ``self/mountinfo`` are read
(``"/proc"`` live). ``sys_root`` is prepended to every mount point taken from
mountinfo (``"/"`` live). A fixture tree therefore holds ``proc/`` and
``sys/fs/cgroup/`` side by side and is located with
``locate(pid, proc_root=tree / "proc", sys_root=tree)``; mountinfo inside it keeps the
real absolute mount points (``/sys/fs/cgroup/...``).

No docker imports: the caller finds the container's host pid itself.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Callable, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from harness.model.counters import PSI, CgroupLimits, CgroupSnapshot
from harness.model.errors import InfraError

__all__ = [
    "CgroupError",
    "CgroupMount",
    "CgroupPaths",
    "SnapshotReader",
    "V1_CONTROLLERS",
    "detect_cgroup_version",
    "guess_driver",
    "locate",
    "parse_cpu_max",
    "parse_cpuset",
    "parse_flat_keyed",
    "parse_max_value",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "parse_psi",
    "parse_v1_bytes_limit",
    "parse_v1_quota",
    "read_limits",
    "read_snapshot",
    "write_limits",
]


class CgroupError(InfraError):
    """A cgroup file or controller the harness needs is missing or unreadable."""


# Controller names a v1 hierarchy can carry in its mount options (everything else in the
# super options is a mount flag such as rw/noprefix/clone_children).
V1_CONTROLLERS = frozenset(
    {
        "blkio", "cpu", "cpuacct", "cpuset", "debug", "devices", "freezer", "hugetlb",
        "memory", "misc", "net_cls", "net_prio", "perf_event", "pids", "rdma",
    }
)

# v1 page counters print "unlimited" as PAGE_COUNTER_MAX * PAGE_SIZE, which depends on
# the page size (9223372036854771712 with 4 KiB pages); anything this large is no limit.
V1_UNLIMITED_BYTES = 1 << 62

_REQUIRED_V1 = ("cpu", "cpuacct", "memory")
_OPTIONAL_V1 = ("cpuset", "pids", "blkio")
_SYSTEMD_SCOPE = re.compile(r"docker-[0-9a-f]+\.scope")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class CgroupMount(_M):
    """One cgroup or cgroup2 mount from ``/proc/self/mountinfo``."""

    mount_point: str = Field(..., description="Where the hierarchy is mounted, e.g. /sys/fs/cgroup/memory.")
    root: str = Field(..., description="Cgroup path of the mount's root ('/' unless a sub-tree is bind-mounted or in a container).")
    fstype: str = Field(..., description="'cgroup' (v1) or 'cgroup2'.")
    controllers: tuple[str, ...] = Field(
        (), description="v1: controllers from the super options (incl. 'name=systemd'); v2: empty."
    )


class CgroupPaths(_M):
    """Host directories of one process's cgroup, per controller.

    On v2 every controller field holds the same unified directory. On v1 ``unified`` is
    the hybrid cgroup2 directory (PSI lives there) or None if the host has none.
    """

    version: int = Field(..., ge=1, le=2, description="1 = legacy or hybrid, 2 = unified.")
    driver: str = Field(..., description="'systemd' (leaf docker-<id>.scope under a .slice) or 'cgroupfs'.")
    cgroup_path: str = Field(..., description="The process's cgroup path as /proc/<pid>/cgroup shows it (v2 entry, or v1 memory).")
    cpu: str = Field(..., description="Directory with cpu.stat and the CFS quota files.")
    cpuacct: str = Field(..., description="Directory with cpuacct.usage (v1) / cpu.stat usage_usec (v2).")
    cpuset: str | None = Field(None, description="Directory with cpuset.cpus; None if the controller is not mounted.")
    memory: str = Field(..., description="Directory with the memory controller files.")
    pids: str | None = Field(None, description="Directory with pids.*; None if the controller is not mounted.")
    unified: str | None = Field(None, description="cgroup2 directory (v2: same as the others; hybrid: PSI files).")
    blkio: str | None = Field(None, description="Directory with the block I/O files (v1 blkio.throttle.*, v2 io.max / io.stat); "
                              "None if the controller is not mounted.")


# --------------------------------------------------------------------------- parsers


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Parse ``/proc/<pid>/cgroup`` into ``{controller: path}``.

    Each v1 line ``ID:cpu,cpuacct:/path`` yields one key per controller (named
    hierarchies keep their ``name=`` form, e.g. ``name=systemd``); the v2 unified line
    ``0::/path`` yields the key ``""``.
    """
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise CgroupError(f"malformed /proc/<pid>/cgroup line {line!r}: expected 'hierarchy-ID:controllers:path'")
        _hid, controllers, path = parts
        if controllers == "":
            out[""] = path
            continue
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup (v1) and cgroup2 mounts listed in a ``/proc/<pid>/mountinfo`` text.

    Line format (proc(5)): ``id parent maj:min root mount-point options [optional...] -
    fstype source super-options``. Other filesystems are skipped.
    """
    mounts: list[CgroupMount] = []
    for raw in text.splitlines():
        fields = raw.split()
        if not fields:
            continue
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise CgroupError(f"malformed mountinfo line {raw!r}: no ' - ' separator") from None
        if len(fields) < sep + 2:
            raise CgroupError(f"malformed mountinfo line {raw!r}: no fstype after ' - '")
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        super_opts = fields[sep + 3] if len(fields) > sep + 3 else ""
        controllers: tuple[str, ...] = ()
        if fstype == "cgroup":
            controllers = tuple(
                o for o in super_opts.split(",") if o in V1_CONTROLLERS or o.startswith("name=")
            )
        mounts.append(
            CgroupMount(
                mount_point=_unescape(fields[4]),
                root=_unescape(fields[3]),
                fstype=fstype,
                controllers=controllers,
            )
        )
    return mounts


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse a flat-keyed file (``key value`` per line) into ints.

    Used for cpu.stat, memory.events, pids.events, memory.stat and v1
    memory.oom_control. Lines whose value is not an integer are skipped, so a kernel
    that adds a non-numeric key does not break the read.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def parse_psi(text: str) -> PSI | None:
    """Parse a PSI file (``some avg10=.. avg60=.. avg300=.. total=N`` and optional ``full``).

    Returns the cumulative totals in microseconds; ``full_us`` is None when the file
    has no ``full`` line (host cpu before Linux 5.13). None if there is no ``some`` line.
    """
    some: int | None = None
    full: int | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        total = next((int(p[6:]) for p in parts[1:] if p.startswith("total=")), None)
        if total is None:
            raise CgroupError(f"malformed PSI line {line!r}: no total=")
        if parts[0] == "some":
            some = total
        elif parts[0] == "full":
            full = total
    if some is None:
        return None
    return PSI(some_us=some, full_us=full)


def parse_cpu_max(text: str) -> tuple[int | None, int | None]:
    """Parse v2 ``cpu.max`` (``"$MAX $PERIOD"``) into ``(quota_us or None, period_us)``."""
    parts = text.split()
    if not parts or len(parts) > 2:
        raise CgroupError(f"malformed cpu.max {text!r}: expected '$MAX $PERIOD'")
    quota = None if parts[0] == "max" else int(parts[0])
    period = int(parts[1]) if len(parts) == 2 else None
    return quota, period


def parse_max_value(text: str) -> int | None:
    """A single value that may be ``max`` (memory.max, memory.swap.max, pids.max): None = unlimited."""
    v = text.strip()
    if not v:
        raise CgroupError("empty value where a number or 'max' was expected")
    return None if v == "max" else int(v)


def parse_v1_bytes_limit(text: str) -> int | None:
    """v1 ``memory.limit_in_bytes`` / ``memory.memsw.limit_in_bytes``: None when unlimited."""
    v = int(text.strip())
    return None if v >= V1_UNLIMITED_BYTES or v < 0 else v


def parse_v1_quota(text: str) -> int | None:
    """v1 ``cpu.cfs_quota_us``: -1 means unlimited (None)."""
    v = int(text.strip())
    return None if v < 0 else v


def parse_cpuset(text: str) -> list[int]:
    """Parse a cpuset list (``"0-3,5,7-8"``) into sorted CPU numbers; ``""`` -> ``[]``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            a, b = int(lo), int(hi)
            if b < a:
                raise CgroupError(f"malformed cpuset range {part!r} in {text!r}")
            cpus.update(range(a, b + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def guess_driver(cgroup_path: str) -> str:
    """'systemd' when the leaf is ``docker-<id>.scope`` inside a ``.slice``, else 'cgroupfs'."""
    parts = [p for p in cgroup_path.split("/") if p]
    if len(parts) >= 2 and _SYSTEMD_SCOPE.fullmatch(parts[-1]) and parts[-2].endswith(".slice"):
        return "systemd"
    return "cgroupfs"


# --------------------------------------------------------------------------- file access


def _read(path: str | None) -> str | None:
    """Read a small kernel file; None if it does not exist (or the kernel refuses it).

    os.open/os.read rather than open(): this is on the 5 Hz sampling path.
    ENODEV: the cgroup was removed under us; EOPNOTSUPP: PSI disabled (psi=0).
    """
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EOPNOTSUPP):
            return None
        raise CgroupError(f"cannot open {path}: {e.strerror}; the controller must run as root on the host") from e
    try:
        return os.read(fd, 65536).decode()
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EOPNOTSUPP, errno.ENOENT):
            return None
        raise CgroupError(f"cannot read {path}: {e.strerror}") from e
    finally:
        os.close(fd)


class HeldFile:
    """A small kernel file held open for reads at 5 Hz: ``pread`` at offset 0 makes the kernel
    generate it afresh (a seq_file restarts at offset 0), one system call per read where
    :func:`_read` makes three and walks the path (on a VM, a third of the cost of a sample
    that wakes cold). With no descriptor to be had (EMFILE), a read is a CgroupError (the
    monitor counts a lost sample) and the next read tries to open the file again.

    For files the kernel shows in one go only (a counter, ``cpu.stat``, ``/proc/stat``,
    ``/proc/meminfo``): a file of many records (``/proc/self/maps``) comes a page per read,
    and v1's ``cgroup.procs``/``tasks`` keep their pid list per open file while it is read
    more often than once a second, so neither is ever held.

    :meth:`read` answers what :func:`_read` answers: the text, None when the file is gone
    (ENODEV: the cgroup was removed under an open descriptor) or absent, CgroupError
    otherwise. The buffer grows while a read fills it (each try a whole read from offset 0),
    so a long file (``/proc/stat`` on a big host) is not cut below 16 MiB. Not thread-safe:
    one owner (a monitor's thread) reads it; after :meth:`close` a read is a CgroupError,
    never a file opened again."""

    __slots__ = ("path", "_fd", "_size", "_closed")

    def __init__(self, path: str, size: int = 16384):
        self.path = path
        self._fd: int | None = None
        self._size = size
        self._closed = False

    def read(self) -> str | None:
        if self._fd is None:
            if self._closed:
                raise CgroupError(f"{self.path} read after its holder closed it")
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise CgroupError(f"cannot open {self.path}: {e.strerror} (raise `ulimit -n`: a monitor holds "
                                      "6 files open while it samples)") from e
                if e.errno in (errno.ENODEV, errno.EOPNOTSUPP):
                    return None
                raise CgroupError(f"cannot open {self.path}: {e.strerror}; the controller must run as root on the host") from e
        try:
            while True:
                data = os.pread(self._fd, self._size, 0)
                if len(data) < self._size or self._size >= 1 << 24:
                    return data.decode()
                self._size *= 4
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.EOPNOTSUPP, errno.ENOENT):
                return None
            raise CgroupError(f"cannot read {self.path}: {e.strerror}") from e

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:  # an owner that forgot close() leaks no descriptor
        try:
            self.close()
        except Exception:  # at interpreter exit `os` may already be gone
            pass


def _join_mount(sys_root: str, mount: CgroupMount, cg_path: str) -> str | None:
    """Host directory of cgroup ``cg_path`` under ``mount``; None if outside the mount's root."""
    root = mount.root.rstrip("/")
    if root:
        if cg_path != root and not cg_path.startswith(root + "/"):
            return None
        rel = cg_path[len(root):]
    else:
        rel = cg_path
    base = os.path.join(sys_root, mount.mount_point.lstrip("/"))
    return os.path.normpath(base + "/" + rel.lstrip("/")) if rel.strip("/") else os.path.normpath(base)


def _pick(mounts: list[CgroupMount], cg_path: str, sys_root: str) -> tuple[str | None, list[CgroupMount]]:
    """First directory (preferring mounts under /sys/fs/cgroup) that exists for cg_path."""
    ordered = sorted(mounts, key=lambda m: not m.mount_point.startswith("/sys/fs/cgroup"))
    for m in ordered:
        d = _join_mount(sys_root, m, cg_path)
        if d is not None and os.path.isdir(d):
            return d, ordered
    return None, ordered


def _explain_missing(what: str, cg_path: str, cands: list[CgroupMount], sys_root: str, src: str) -> str:
    if not cands:
        return (
            f"{what}: no {('cgroup2' if what == 'unified' else 'cgroup v1')} mount for it in mountinfo "
            f"(cgroup {cg_path} from {src}); mount the hierarchy on the host or fix proc_root"
        )
    tried = []
    for m in cands:
        d = _join_mount(sys_root, m, cg_path)
        tried.append(f"{m.mount_point} (root {m.root}) -> " + (d if d else "path outside the mount root"))
    return (
        f"{what}: cgroup {cg_path} from {src} has no directory on the host; tried "
        + "; ".join(tried)
        + ". The container may have exited (read counters before stopping it), or the "
        "controller runs in another cgroup namespace (run it on the host / --cgroupns=host)"
    )


def locate(pid: int | str, proc_root: str | os.PathLike = "/proc", sys_root: str | os.PathLike = "/") -> CgroupPaths:
    """Find the host cgroup directories of process ``pid`` (a container's init).

    Reads ``<proc_root>/<pid>/cgroup`` and ``<proc_root>/self/mountinfo``; mount points
    are resolved under ``sys_root``. Mount roots other than ``/`` (a controller running
    inside a container, bind-mounted sub-trees) are handled by taking the cgroup path
    relative to the mount's root. Raises :class:`CgroupError` naming the missing file or
    controller and the next step.
    """
    proc_root, sys_root = str(proc_root), str(sys_root)
    cg_file = os.path.join(proc_root, str(pid), "cgroup")
    mi_file = os.path.join(proc_root, "self", "mountinfo")
    cg_text = _read(cg_file)
    if cg_text is None:
        raise CgroupError(
            f"{cg_file} not found: process {pid} is gone (container exited?) or proc_root is wrong; "
            "locate the cgroup right after the container starts"
        )
    entries = parse_proc_cgroup(cg_text)
    for c, path in entries.items():
        if ".." in path.split("/"):
            raise CgroupError(
                f"{cg_file}: cgroup {path!r} ({c or 'unified'}) lies outside this process's cgroup "
                "namespace; run the controller in the host cgroup namespace (--cgroupns=host)"
            )
    mi_text = _read(mi_file)
    if mi_text is None:
        raise CgroupError(f"{mi_file} not found: proc_root {proc_root} is not a mounted /proc")
    mounts = parse_mountinfo(mi_text)
    v2_mounts = [m for m in mounts if m.fstype == "cgroup2"]

    if not any(c in V1_CONTROLLERS for c in entries):
        if "" not in entries:
            raise CgroupError(f"{cg_file} has neither v1 controller lines nor a v2 '0::' line; is it a cgroup file?")
        path = entries[""]
        d, cands = _pick(v2_mounts, path, sys_root)
        if d is None:
            raise CgroupError(_explain_missing("unified", path, cands, sys_root, cg_file))
        return CgroupPaths(
            version=2, driver=guess_driver(path), cgroup_path=path,
            cpu=d, cpuacct=d, cpuset=d, memory=d, pids=d, unified=d, blkio=d,
        )

    dirs: dict[str, str | None] = {}
    for c in _REQUIRED_V1 + _OPTIONAL_V1:
        if c not in entries:
            if c in _REQUIRED_V1:
                raise CgroupError(
                    f"controller {c!r} has no line in {cg_file} (cgroup v1 host); mount the v1 {c} "
                    "controller on the host or switch the host to cgroup v2"
                )
            dirs[c] = None
            continue
        cands = [m for m in mounts if m.fstype == "cgroup" and c in m.controllers]
        d, ordered = _pick(cands, entries[c], sys_root)
        if d is None:
            if c in _REQUIRED_V1 or cands and c != "blkio":  # blkio only serves the optional disk limits and counters
                raise CgroupError(_explain_missing(f"controller {c!r}", entries[c], ordered, sys_root, cg_file))
        dirs[c] = d
    unified = None
    if "" in entries and v2_mounts:
        unified, _ = _pick(v2_mounts, entries[""], sys_root)
    path = entries["memory"]
    return CgroupPaths(
        version=1, driver=guess_driver(path), cgroup_path=path,
        cpu=dirs["cpu"], cpuacct=dirs["cpuacct"], cpuset=dirs["cpuset"], memory=dirs["memory"],
        pids=dirs["pids"], unified=unified, blkio=dirs["blkio"],
    )


def detect_cgroup_version(sys_root: str | os.PathLike = "/") -> str:
    """Host cgroup mode: ``"2"`` (unified), ``"1 (hybrid)"`` (cgroup2 at .../unified) or ``"1"``."""
    base = Path(sys_root) / "sys/fs/cgroup"
    if (base / "cgroup.controllers").exists():
        return "2"
    if (base / "unified" / "cgroup.controllers").exists():
        return "1 (hybrid)"
    return "1"


# --------------------------------------------------------------------------- limits


def _opt_int(text: str | None) -> int | None:
    return None if text is None else int(text.strip())


def parse_v1_bps_device(text: str) -> dict[str, int]:
    """v1 ``blkio.throttle.{read,write}_bps_device``: 'MAJ:MIN BPS' lines -> {'MAJ:MIN': bps}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and ":" in parts[0] and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _device_lines(text: str) -> list[tuple[str, dict[str, str]]]:
    """'MAJ:MIN key=value ...' lines (v2 io.max, io.stat) -> [(device, {key: value})]."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts and ":" in parts[0]:
            out.append((parts[0], dict(p.split("=", 1) for p in parts[1:] if "=" in p)))
    return out


def parse_io_max(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """v2 ``io.max``: 'MAJ:MIN rbps=N wbps=max riops=max wiops=max' lines -> (read bps, write bps) per device
    (a 'max' entry is no limit and is left out)."""
    rd, wr = {}, {}
    for dev, kv in _device_lines(text):
        if kv.get("rbps", "max").isdigit():
            rd[dev] = int(kv["rbps"])
        if kv.get("wbps", "max").isdigit():
            wr[dev] = int(kv["wbps"])
    return rd, wr


def parse_io_bytes(text: str, version: int) -> tuple[int, int]:
    """Bytes read and written, summed over devices: v1 ``blkio.throttle.io_service_bytes``
    ('MAJ:MIN Read N' lines), v2 ``io.stat`` ('MAJ:MIN rbytes=N wbytes=N ...')."""
    rd = wr = 0
    if version == 2:
        for _, kv in _device_lines(text):
            rd += int(kv["rbytes"]) if kv.get("rbytes", "").isdigit() else 0
            wr += int(kv["wbytes"]) if kv.get("wbytes", "").isdigit() else 0
        return rd, wr
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and ":" in parts[0] and parts[2].isdigit():
            if parts[1] == "Read":
                rd += int(parts[2])
            elif parts[1] == "Write":
                wr += int(parts[2])
    return rd, wr


def read_limits(paths: CgroupPaths) -> CgroupLimits:
    """Read back the envelope the kernel applied (missing files -> None)."""
    j = os.path.join
    if paths.version == 2:
        d = paths.unified or paths.memory
        quota = period = None
        cm = _read(j(d, "cpu.max"))
        if cm is not None:
            quota, period = parse_cpu_max(cm)
        cs = _read(j(d, "cpuset.cpus.effective"))
        if cs is None:
            cs = _read(j(d, "cpuset.cpus"))
        mem = _read(j(d, "memory.max"))
        swp = _read(j(d, "memory.swap.max"))
        memory_max = parse_max_value(mem) if mem is not None else None
        swap_max = parse_max_value(swp) if swp is not None else None
        pm = _read(j(d, "pids.max"))
        iom = _read(j(paths.blkio, "io.max")) if paths.blkio else None
        io_rd, io_wr = parse_io_max(iom) if iom is not None else ({}, {})
        return CgroupLimits(
            cgroup_version=2,
            io_read_bps=io_rd,
            io_write_bps=io_wr,
            cpu_quota_us=quota,
            cpu_period_us=period,
            cpuset_cpus=parse_cpuset(cs) if cs is not None else None,
            memory_max=memory_max,
            memsw_max=memory_max + swap_max if memory_max is not None and swap_max is not None else None,
            swap_max=swap_max,
            pids_max=parse_max_value(pm) if pm is not None else None,
        )
    q = _read(j(paths.cpu, "cpu.cfs_quota_us"))
    cs = _read(j(paths.cpuset, "cpuset.cpus")) if paths.cpuset else None
    mem = _read(j(paths.memory, "memory.limit_in_bytes"))
    msw = _read(j(paths.memory, "memory.memsw.limit_in_bytes"))
    memory_max = parse_v1_bytes_limit(mem) if mem is not None else None
    memsw_max = parse_v1_bytes_limit(msw) if msw is not None else None
    pm = _read(j(paths.pids, "pids.max")) if paths.pids else None
    rb = _read(j(paths.blkio, "blkio.throttle.read_bps_device")) if paths.blkio else None
    wb = _read(j(paths.blkio, "blkio.throttle.write_bps_device")) if paths.blkio else None
    return CgroupLimits(
        cgroup_version=1,
        io_read_bps=parse_v1_bps_device(rb) if rb is not None else {},
        io_write_bps=parse_v1_bps_device(wb) if wb is not None else {},
        cpu_quota_us=parse_v1_quota(q) if q is not None else None,
        cpu_period_us=_opt_int(_read(j(paths.cpu, "cpu.cfs_period_us"))),
        cpuset_cpus=parse_cpuset(cs) if cs is not None else None,
        memory_max=memory_max,
        memsw_max=memsw_max,
        swap_max=memsw_max - memory_max if memsw_max is not None and memory_max is not None else None,
        pids_max=parse_max_value(pm) if pm is not None else None,
    )


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


# the lowest CPU weight a cgroup can have among its siblings (v2 cpu.weight, v1 cpu.shares)
LOWEST_CPU_WEIGHT = {2: "1", 1: "2"}


def cpu_weight_file(paths: CgroupPaths) -> str:
    """The file of a cgroup's CPU weight relative to its siblings: cpu.weight (v2) or cpu.shares (v1)."""
    return os.path.join(paths.unified or paths.memory, "cpu.weight") if paths.version == 2 else os.path.join(paths.cpu, "cpu.shares")


def set_cpu_weight(paths: CgroupPaths, value: str) -> str:
    """Write a cgroup's CPU weight (as the kernel writes it back: ``cpu_weight_file``) and
    return what it held before. Raises OSError when the kernel or the mount refuses, or when
    it does not read back as written."""
    f = cpu_weight_file(paths)
    before = _read(f)
    if before is None:
        raise OSError(2, "no CPU weight file", f)
    _write(f, value)
    if (_read(f) or "").strip() != value:
        _write(f, before.strip())  # as it was: a weight not read back is not left behind
        raise OSError(5, f"{f} did not read back as {value}")
    return before.strip()


def write_limits(paths: CgroupPaths, memory: int, cpu_quota_us: int) -> CgroupLimits:
    """Set a cgroup's memory ceiling (swap none: memory+swap = memory) and CPU quota (its period
    kept) in the kernel's own files, then read them back. What ``docker update`` ends in, without
    the engine round trip (a grade envelope is set on every attempt's critical path). Raises
    OSError when the kernel or the mount refuses (read-only /sys/fs/cgroup, a limit below what is
    in use): the caller falls back to its engine's API."""
    j = os.path.join
    if paths.version == 2:
        d = paths.unified or paths.memory
        _write(j(d, "memory.max"), str(memory))
        if os.path.exists(j(d, "memory.swap.max")):
            _write(j(d, "memory.swap.max"), "0")
        _, period = parse_cpu_max(_read(j(d, "cpu.max")) or "max 100000")
        _write(j(d, "cpu.max"), f"{cpu_quota_us} {period or 100000}")
        return read_limits(paths)
    limit, memsw = j(paths.memory, "memory.limit_in_bytes"), j(paths.memory, "memory.memsw.limit_in_bytes")
    swap_accounted = os.path.exists(memsw)
    # v1 keeps memsw >= memory at every step: raise memsw first, lower it last
    text = _read(limit)
    now = parse_v1_bytes_limit(text) if text is not None else None  # None: unlimited
    for f in ((memsw, limit) if now is not None and memory >= now else (limit, memsw)):
        if f == limit or swap_accounted:
            _write(f, str(memory))
    _write(j(paths.cpu, "cpu.cfs_quota_us"), str(cpu_quota_us))
    return read_limits(paths)


# --------------------------------------------------------------------------- snapshots


def _existing(path: str | None) -> str | None:
    return path if path is not None and os.path.exists(path) else None


class SnapshotReader:
    """Reads :class:`CgroupSnapshot` from one cgroup; built once per attempt.

    Path discovery happens here, once: optional files that do not exist now (memory.peak
    before Linux 5.19, pids.peak, memory.oom_control's oom_kill, PSI on the hybrid
    unified dir) are dropped and read as None ever after, so each :meth:`read` opens
    only files that are there (10-12 small reads).
    """

    def __init__(self, paths: CgroupPaths):
        self.paths = paths
        self.version = paths.version
        j = os.path.join
        psi_dir = paths.unified
        self._psi = tuple(
            _existing(j(psi_dir, f"{r}.pressure")) if psi_dir else None for r in ("cpu", "memory", "io")
        )
        pd = paths.pids
        self._pids_current = _existing(j(pd, "pids.current")) if pd else None
        self._pids_peak = _existing(j(pd, "pids.peak")) if pd else None
        self._pids_events = _existing(j(pd, "pids.events")) if pd else None
        bd = paths.blkio
        self._io_bytes = (_existing(j(bd, "io.stat")) if paths.version == 2 else _existing(j(bd, "blkio.throttle.io_service_bytes"))) \
            if bd else None
        if self.version == 2:
            d = paths.unified or paths.memory
            self._usage = j(d, "cpu.stat")
            self._mem_current = _existing(j(d, "memory.current"))
            self._mem_peak = _existing(j(d, "memory.peak"))
            self._mem_events = _existing(j(d, "memory.events"))
        else:
            self._usage = j(paths.cpuacct, "cpuacct.usage")
            self._cpu_stat = _existing(j(paths.cpu, "cpu.stat"))
            m = paths.memory
            self._mem_current = _existing(j(m, "memory.usage_in_bytes"))
            self._mem_peak = _existing(j(m, "memory.max_usage_in_bytes"))
            self._failcnt = _existing(j(m, "memory.failcnt"))
            self._oom_control = _existing(j(m, "memory.oom_control"))
        if not os.path.exists(self._usage):
            raise CgroupError(
                f"{self._usage} does not exist: cgroup {paths.cgroup_path} is gone or the "
                f"{'cpu' if self.version == 2 else 'cpuacct'} controller is not enabled for it"
            )

    def _gone(self) -> CgroupError:
        return CgroupError(
            f"cgroup {self.paths.cgroup_path} vanished ({self._usage} unreadable): the container exited; "
            "read the final counters before stopping it"
        )

    def read(self, t: float, io: bool = True) -> CgroupSnapshot:
        """One snapshot at monotonic time ``t``. Raises CgroupError if the cgroup is gone.
        ``io=False`` skips the block I/O file (the saturation samples do not keep it)."""
        psi = [parse_psi(x) if (x := _read(p)) is not None else None for p in self._psi]
        pc = _read(self._pids_current)
        pp = _read(self._pids_peak)
        pe = _read(self._pids_events)
        pids_hits = parse_flat_keyed(pe).get("max") if pe is not None else None
        iob = _read(self._io_bytes) if io else None
        io_rd, io_wr = parse_io_bytes(iob, self.version) if iob is not None else (None, None)
        if self.version == 2:
            stat_text = _read(self._usage)
            if stat_text is None:
                raise self._gone()
            st = parse_flat_keyed(stat_text)
            cur = _read(self._mem_current)
            peak = _read(self._mem_peak)
            ev_text = _read(self._mem_events)
            ev = parse_flat_keyed(ev_text) if ev_text is not None else {}
            return CgroupSnapshot(
                t=t,
                cpu_usage_us=st["usage_usec"],
                nr_periods=st.get("nr_periods"),
                nr_throttled=st.get("nr_throttled"),
                throttled_us=st.get("throttled_usec"),
                memory_current=_opt_int(cur),
                memory_peak=_opt_int(peak),
                memory_limit_hits=ev.get("max"),
                memory_high_events=ev.get("high"),
                oom_events=ev.get("oom"),
                oom_kills=ev.get("oom_kill"),
                pids_current=_opt_int(pc),
                pids_peak=_opt_int(pp),
                pids_limit_hits=pids_hits,
                psi_cpu=psi[0],
                psi_memory=psi[1],
                psi_io=psi[2],
                io_read_bytes=io_rd,
                io_write_bytes=io_wr,
            )
        usage = _read(self._usage)
        if usage is None:
            raise self._gone()
        cs_text = _read(self._cpu_stat)
        cs = parse_flat_keyed(cs_text) if cs_text is not None else {}
        thr_ns = cs.get("throttled_time")
        oc = _read(self._oom_control)
        return CgroupSnapshot(
            t=t,
            cpu_usage_us=int(usage) // 1000,
            nr_periods=cs.get("nr_periods"),
            nr_throttled=cs.get("nr_throttled"),
            throttled_us=thr_ns // 1000 if thr_ns is not None else None,
            memory_current=_opt_int(_read(self._mem_current)),
            memory_peak=_opt_int(_read(self._mem_peak)),
            memory_limit_hits=_opt_int(_read(self._failcnt)),
            memory_high_events=None,
            oom_events=None,
            oom_kills=parse_flat_keyed(oc).get("oom_kill") if oc is not None else None,
            pids_current=_opt_int(pc),
            pids_peak=_opt_int(pp),
            pids_limit_hits=pids_hits,
            psi_cpu=psi[0],
            psi_memory=psi[1],
            psi_io=psi[2],
            io_read_bytes=io_rd,
            io_write_bytes=io_wr,
        )

    __call__ = read

    def sample(self) -> "SampleCounters":
        """What one saturation sample keeps, and nothing else: CPU usage and throttling,
        memory and pids now (3 files on v2, 4 on v1, against 10-12 for :meth:`read`). The
        peaks and event counts a sample does not keep come from the snapshots that bracket
        the attempt. Raises CgroupError if the cgroup is gone."""
        return self._sample(_read)

    def held(self) -> "HeldSampler":
        """A sampler that holds the sample's files open (:class:`HeldFile`) for a monitor's
        thread: the values of :meth:`sample`, one system call per file. Close it when done."""
        return HeldSampler(self)

    def _sample(self, read: Callable[[str | None], str | None]) -> "SampleCounters":
        if self.version == 2:
            text = read(self._usage)
            if text is None:
                raise self._gone()
            usage = thr_us = nr_thr = None
            for line in text.splitlines():  # a malformed value is skipped, as read() skips it
                k, _, v = line.partition(" ")
                if k == "usage_usec":
                    usage = _int(v)
                elif k == "throttled_usec":
                    thr_us = _int(v)
                elif k == "nr_throttled":
                    nr_thr = _int(v)
            if usage is None:
                raise CgroupError(f"{self._usage} has no usage_usec line with a number")
            return SampleCounters(usage, thr_us, nr_thr, _int(read(self._mem_current)), _int(read(self._pids_current)))
        text = read(self._usage)
        if text is None:
            raise self._gone()
        usage_ns = _int(text)
        if usage_ns is None:
            raise CgroupError(f"{self._usage} does not hold a number")
        thr_ns = nr_thr = None
        cs = read(self._cpu_stat)
        for line in (cs or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "throttled_time":
                thr_ns = _int(v)
            elif k == "nr_throttled":
                nr_thr = _int(v)
        return SampleCounters(usage_ns // 1000, thr_ns // 1000 if thr_ns is not None else None, nr_thr,
                              _int(read(self._mem_current)), _int(read(self._pids_current)))


class HeldSampler:
    """:meth:`SnapshotReader.sample` on files held open (:meth:`SnapshotReader.held`)."""

    def __init__(self, reader: SnapshotReader):
        self._reader = reader
        self._files: dict[str, HeldFile] = {}
        self._closed = False

    def _read(self, path: str | None) -> str | None:
        if path is None:
            return None
        if self._closed:
            raise CgroupError(f"{path} read after its holder closed it")
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = HeldFile(path)
        return f.read()

    def sample(self) -> "SampleCounters":
        return self._reader._sample(self._read)

    def close(self) -> None:
        self._closed = True
        for f in self._files.values():
            f.close()
        self._files.clear()


def _int(text: str | None) -> int | None:
    """A counter file's (or line's) number; None when absent or not a number."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


class SampleCounters(NamedTuple):
    """The cgroup counters of one saturation sample (:meth:`SnapshotReader.sample`)."""

    cpu_usage_us: int
    throttled_us: int | None
    nr_throttled: int | None
    memory_current: int | None
    pids_current: int | None


def read_snapshot(paths: CgroupPaths | SnapshotReader, t: float) -> CgroupSnapshot:
    """One :class:`CgroupSnapshot` at time ``t``.

    Pass a :class:`SnapshotReader` on the sampling path; passing :class:`CgroupPaths`
    builds a throw-away reader (path discovery on every call).
    """
    reader = paths if isinstance(paths, SnapshotReader) else SnapshotReader(paths)
    return reader.read(t)
