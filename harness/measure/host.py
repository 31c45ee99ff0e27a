"""Host-side contention signals: per-CPU busy time, steal, host PSI, MemAvailable.

Pure parsers (:func:`parse_proc_stat`, :func:`parse_meminfo`, PSI via
:func:`harness.measure.cgroup.parse_psi`) plus readers that take ``proc_root`` (and
``sys_root`` for :func:`host_facts`) so tests can point them at recorded trees under
``tests/fixtures/proc/``.

Busy time per CPU is user + nice + system + irq + softirq. The kernel already counts
guest time inside user (and guest_nice inside nice), so guest columns are not added
again; idle, iowait and steal are not busy. Total is the sum of the first eight columns
(user..steal). /proc/stat counts in USER_HZ ticks (``os.sysconf('SC_CLK_TCK')``, 100 on
Linux), so these values have 10 ms granularity, unlike the cgroup's ns/µs counters.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from typing import NamedTuple

from harness.measure.cgroup import HeldFile, detect_cgroup_version, parse_psi
from harness.model.counters import PSI, HostSnapshot
from harness.model.units import one_line

__all__ = [
    "busy_cores",
    "HostSampler",
    "CpuTimes",
    "host_facts",
    "mem_available",
    "parse_cpuinfo_model",
    "parse_meminfo",
    "parse_proc_stat",
    "read_host_snapshot",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class CpuTimes(NamedTuple):
    """Per-CPU busy and total time, steal summed over CPUs and per CPU, all in microseconds."""

    busy_us: dict[int, int]
    total_us: dict[int, int]
    steal_us: int
    steal_by_cpu: dict[int, int]


def _read(path: str) -> str | None:
    """A small /proc file's text, or None if absent (or refused, e.g. PSI disabled by psi=0)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 1 << 20).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def _busy_us(v: list[int], clk_tck: int) -> int:
    """Busy microseconds of one /proc/stat CPU line's columns (user nice system idle iowait
    irq softirq ...): user + nice + system + irq + softirq."""
    return (v[0] + v[1] + v[2] + v[5] + v[6]) * 1_000_000 // clk_tck


def parse_proc_stat(text: str, clk_tck: int = _CLK_TCK) -> CpuTimes:
    """Per-CPU times from ``/proc/stat`` (``cpuN user nice system idle iowait irq softirq steal guest guest_nice``).

    Offline CPUs have no line and are absent from the result. Older kernels print fewer
    columns; missing ones count as 0.
    """
    busy: dict[int, int] = {}
    total: dict[int, int] = {}
    steal: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        try:
            cpu = int(parts[0][3:])
        except ValueError:
            continue
        v = [int(x) for x in parts[1:9]] + [0] * max(0, 8 - len(parts[1:9]))
        user, nice, system, idle, iowait, irq, softirq, st = v
        busy[cpu] = _busy_us(v, clk_tck)
        total[cpu] = (user + nice + system + idle + iowait + irq + softirq + st) * 1_000_000 // clk_tck
        steal[cpu] = st * 1_000_000 // clk_tck
    if not busy:
        raise ValueError("no per-CPU 'cpuN' lines in /proc/stat text")
    return CpuTimes(busy, total, sum(steal.values()), steal)


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as ``{key: value}``; ``kB`` values converted to bytes, unitless ones kept."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            n = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = n * 1024 if len(parts) > 1 and parts[1] == "kB" else n
    return out


def mem_available(meminfo: dict[str, int]) -> int:
    """MemAvailable in bytes; before Linux 3.14 estimated as MemFree + Buffers + Cached."""
    if "MemAvailable" in meminfo:
        return meminfo["MemAvailable"]
    try:
        return meminfo["MemFree"] + meminfo.get("Buffers", 0) + meminfo.get("Cached", 0)
    except KeyError:
        raise ValueError("meminfo has neither MemAvailable nor MemFree") from None


def _psi(proc_root: str, resource: str) -> PSI | None:
    text = _read(os.path.join(proc_root, "pressure", resource))
    return parse_psi(text) if text else None


_NOT_DISKS = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")


def parse_diskstats(text: str, disks: set[str] | None = None) -> int:
    """Bytes read + written (sectors x 512) over whole disks in ``/proc/diskstats``:
    those in ``disks`` when given (the names under /sys/block), never loop, ram, zram,
    device-mapper or md devices (their I/O is counted again on the disks under them)."""
    total = 0
    for line in text.splitlines():
        f = line.split()
        if len(f) < 10 or f[2].startswith(_NOT_DISKS) or (disks is not None and f[2] not in disks):
            continue
        try:
            total += (int(f[5]) + int(f[9])) * 512
        except ValueError:
            continue
    return total


_DISKS: set[str] | None = None


def _whole_disks() -> set[str] | None:
    global _DISKS
    if _DISKS is None:
        try:
            _DISKS = set(os.listdir("/sys/block"))
        except OSError:
            return None
    return _DISKS


def block_device_of(path: str, sys_root: str | os.PathLike = "/") -> tuple[str, str] | None:
    """(device node, 'MAJ:MIN') of the whole disk that holds ``path`` (a partition's parent),
    or None when ``path`` is on no block device (overlay, tmpfs, a remote engine's path)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
    base = os.path.join(str(sys_root), "sys/dev/block", f"{maj}:{mnr}")
    if maj == 0 or not os.path.exists(base):
        return None
    d = os.path.realpath(base)
    if os.path.exists(os.path.join(d, "partition")):
        d = os.path.dirname(d)
    dev = (_read(os.path.join(d, "dev")) or "").strip()
    name = next((ln.split("=", 1)[1] for ln in (_read(os.path.join(d, "uevent")) or "").splitlines() if ln.startswith("DEVNAME=")), "")
    if not dev or not name:
        return None
    return f"/dev/{name}", dev


def read_host_snapshot(t: float, proc_root: str | os.PathLike = "/proc", clk_tck: int = _CLK_TCK, disk: bool = True) -> HostSnapshot:
    """Host contention counters at monotonic time ``t`` (PSI files absent -> None). ``disk=False``
    skips /proc/diskstats (the saturation samples do not keep disk bytes)."""
    proc_root = str(proc_root)
    stat = _read(os.path.join(proc_root, "stat"))
    meminfo = _read(os.path.join(proc_root, "meminfo"))
    if stat is None or meminfo is None:
        raise FileNotFoundError(f"{proc_root}/stat or {proc_root}/meminfo missing: proc_root is not a mounted /proc")
    cpu = parse_proc_stat(stat, clk_tck)
    return HostSnapshot(
        t=t,
        cpu_busy_us=cpu.busy_us,
        cpu_total_us=cpu.total_us,
        steal_us=cpu.steal_us,
        cpu_steal_us=cpu.steal_by_cpu,
        psi_cpu=_psi(proc_root, "cpu"),
        psi_memory=_psi(proc_root, "memory"),
        psi_io=_psi(proc_root, "io"),
        mem_available=mem_available(parse_meminfo(meminfo)),
        disk_bytes=_disk_bytes(proc_root) if disk else None,
    )


class HostSampler:
    """What one saturation sample keeps of the host: busy time of the pinned CPUs and
    MemAvailable, from /proc/stat and /proc/meminfo only (no PSI, no other CPUs' lines, no
    other meminfo keys), parsed as :func:`parse_proc_stat` and :func:`mem_available` do.
    Both files are held open (:class:`HeldFile`) until :meth:`close`."""

    def __init__(self, cpus: list[int], proc_root: str | os.PathLike = "/proc", clk_tck: int = _CLK_TCK):
        self._prefixes = {f"cpu{c} ": c for c in cpus}
        self._stat = os.path.join(str(proc_root), "stat")
        self._meminfo = os.path.join(str(proc_root), "meminfo")
        self._held = (HeldFile(self._stat), HeldFile(self._meminfo))
        self._clk_tck = clk_tck

    def close(self) -> None:
        for f in self._held:
            f.close()

    def busy_us(self) -> dict[int, int]:
        """Busy microseconds (user + nice + system + irq + softirq) of each pinned CPU online."""
        text = self._held[0].read()
        if text is None:
            raise FileNotFoundError(f"{self._stat} missing: not a mounted /proc")
        out: dict[int, int] = {}
        for line in text.splitlines():
            if not line.startswith("cpu"):
                break  # the per-CPU lines come first
            c = self._prefixes.get(line[:line.find(" ") + 1])
            if c is not None:
                v = [int(x) for x in line.split()[1:8]]
                out[c] = _busy_us(v + [0] * (7 - len(v)), self._clk_tck)
        if not out and "\ncpu" not in text:  # as parse_proc_stat: no per-CPU line at all is a bad read, not idle CPUs
            raise ValueError("no per-CPU 'cpuN' lines in /proc/stat text")
        return out

    def mem_available(self) -> int:
        text = self._held[1].read()
        if text is None:
            raise FileNotFoundError(f"{self._meminfo} missing: not a mounted /proc")
        i = text.find("MemAvailable:")
        if i < 0:  # before Linux 3.14
            return mem_available(parse_meminfo(text))
        end = text.find("\n", i)
        parts = text[i + 13:end if end >= 0 else len(text)].split()
        return int(parts[0]) * 1024 if len(parts) > 1 and parts[1] == "kB" else int(parts[0])


def _disk_bytes(proc_root: str) -> int | None:
    text = _read(os.path.join(proc_root, "diskstats"))
    return parse_diskstats(text, _whole_disks() if proc_root == "/proc" else None) if text is not None else None


def parse_cpuinfo_model(text: str) -> str | None:
    """CPU model from ``/proc/cpuinfo`` ("model name" on x86, "Hardware"/"cpu model" elsewhere)."""
    keys = ("model name", "Hardware", "cpu model", "Processor", "cpu")
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        key = key.strip()
        if sep and key in keys and key not in found and val.strip():
            found[key] = val.strip()
    return next((found[k] for k in keys if k in found), None)


def host_facts(proc_root: str | os.PathLike = "/proc", sys_root: str | os.PathLike = "/") -> dict:
    """Facts for a run's identity.

    Keys: ``kernel`` (release), ``cpu_model``, ``logical_cpus`` (online, from
    /proc/stat), ``memory_total`` (bytes), ``cgroup_version`` (``"2"``,
    ``"1 (hybrid)"`` or ``"1"``), ``psi`` (bool: /proc/pressure readable), ``hostname``.
    """
    proc_root = str(proc_root)
    j = os.path.join
    kernel = (_read(j(proc_root, "sys/kernel/osrelease")) or platform.release()).strip()
    hostname = (_read(j(proc_root, "sys/kernel/hostname")) or socket.gethostname()).strip()
    model = parse_cpuinfo_model(_read(j(proc_root, "cpuinfo")) or "") or platform.processor() or "unknown"
    stat = _read(j(proc_root, "stat"))
    cpus = len(parse_proc_stat(stat).busy_us) if stat else (os.cpu_count() or 0)
    meminfo = parse_meminfo(_read(j(proc_root, "meminfo")) or "")
    psi_text = _read(j(proc_root, "pressure", "cpu"))
    return {
        "kernel": kernel,
        "cpu_model": model,
        "logical_cpus": cpus,
        "memory_total": meminfo.get("MemTotal"),
        "cgroup_version": detect_cgroup_version(sys_root),
        "psi": bool(psi_text and parse_psi(psi_text) is not None),
        "hostname": hostname,
    }



# --------------------------------------------------------------------------- busy cores


def _proc_times(proc_root: str) -> dict[int, tuple[str, int, int]]:
    """pid -> (name, utime + stime in ticks, last CPU) for every process, from /proc/PID/stat."""
    out: dict[int, tuple[str, int, int]] = {}
    try:
        pids = [int(p) for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        text = _read(os.path.join(proc_root, str(pid), "stat"))
        if not text or ")" not in text:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        rest = text[text.rindex(")") + 2:].split()
        try:  # fields after the name: state(3) ... utime(14) stime(15) ... processor(39)
            out[pid] = (name, int(rest[11]) + int(rest[12]), int(rest[36]))
        except (IndexError, ValueError):
            continue
    return out


class CoreProbe:
    """How busy ``cores`` are from now until :meth:`result`: begun early (the controller's own
    start-up runs on its reserved cores), it costs a run no wait of its own. Every core's
    counters are read, so a probe begun before the trial cores are known (``cores`` None)
    answers for the cores :meth:`result` is given."""

    def __init__(self, cores: list[int] | None = None, proc_root: str | os.PathLike = "/proc", clk_tck: int = _CLK_TCK):
        self.cores, self.proc_root, self.clk_tck = list(cores or []), str(proc_root), clk_tck
        self.t0 = time.monotonic()
        self._a = parse_proc_stat(_read(os.path.join(self.proc_root, "stat")) or "", clk_tck)
        self._pa = _proc_times(self.proc_root)

    def age(self) -> float:
        return time.monotonic() - self.t0

    def result(self, seconds: float, threshold: float = 0.5, cores: list[int] | None = None) -> dict[int, tuple[float, list[str]]]:
        """Cores (``cores``, else the probe's) busier than ``threshold`` over the probe, which
        lasts at least ``seconds`` (slept out here if less has passed): core -> (busy share,
        the processes that ran on it most, as "pid N name (share)"). A quiet machine gives {}."""
        time.sleep(max(0.0, max(0.05, seconds) - self.age()))
        b = parse_proc_stat(_read(os.path.join(self.proc_root, "stat")) or "", self.clk_tck)
        pb = _proc_times(self.proc_root)
        wall_us = max(1.0, self.age() * 1e6)
        out: dict[int, tuple[float, list[str]]] = {}
        me = os.getpid()
        for c in self.cores if cores is None else cores:
            share = max(0, b.busy_us.get(c, 0) - self._a.busy_us.get(c, 0)) / wall_us
            if share <= threshold:
                continue
            who = []
            for pid, (name, ticks, cpu) in pb.items():
                if cpu != c or pid == me:
                    continue
                # a process started since the probe began spent all its time inside it
                used = (ticks - (self._pa[pid][1] if pid in self._pa else 0)) * 1e6 / self.clk_tck / wall_us
                if used >= 0.05:
                    who.append((used, f"pid {pid} {one_line(name)} ({used:.0%})"))
            out[c] = (min(1.0, share), [w for _, w in sorted(who, reverse=True)[:3]])
        return out


def busy_cores(cores: list[int], seconds: float, threshold: float = 0.5, proc_root: str | os.PathLike = "/proc",
               clk_tck: int = _CLK_TCK) -> dict[int, tuple[float, list[str]]]:
    """Cores busier than ``threshold`` over a ``seconds`` probe begun now (see :class:`CoreProbe`)."""
    return CoreProbe(cores, proc_root, clk_tck).result(seconds, threshold)
