"""Normalized saturation counters, the same shape for cgroup v1 and v2.

Pure module (plain data): the parsers in ``harness.measure.cgroup`` and ``harness.measure.host`` fill
these models from kernel files; ``delta`` turns two snapshots into what one attempt
suffered. Times are in microseconds, sizes in bytes. ``None`` means "this kernel / cgroup
version does not expose it", never zero.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class PSI(_M):
    """Pressure stall totals (cumulative microseconds), from a ``*.pressure`` file."""

    some_us: int = Field(..., ge=0, description="Total time some task stalled on the resource.")
    full_us: int | None = Field(None, ge=0, description="Total time all non-idle tasks stalled (absent for host cpu on old kernels).")


class CgroupLimits(_M):
    """The envelope as the kernel applied it, read back from the container's cgroup."""

    cgroup_version: int = Field(..., ge=1, le=2, description="1 (legacy/hybrid) or 2 (unified).")
    cpu_quota_us: int | None = Field(None, description="CFS quota per period; None = unlimited ('max' / -1).")
    cpu_period_us: int | None = Field(None, description="CFS period.")
    cpuset_cpus: list[int] | None = Field(None, description="CPUs the cgroup may run on.")
    memory_max: int | None = Field(None, description="Memory ceiling in bytes; None = unlimited.")
    memsw_max: int | None = Field(
        None,
        description="v1: memory+swap ceiling; v2: memory.max + memory.swap.max. None = unknown/unlimited.",
    )
    swap_max: int | None = Field(None, description="v2 memory.swap.max (bytes of swap allowed); v1: memsw - memory.")
    pids_max: int | None = Field(None, description="pids limit; None = unlimited.")
    io_read_bps: dict[str, int] = Field(default_factory=dict, description="Disk read limits, 'MAJ:MIN' -> bytes/s "
                                        "(v1 blkio.throttle.read_bps_device, v2 io.max rbps); empty = none.")
    io_write_bps: dict[str, int] = Field(default_factory=dict, description="Disk write limits, 'MAJ:MIN' -> bytes/s.")


class CgroupSnapshot(_M):
    """Cumulative counters of one cgroup at one instant."""

    t: float = Field(..., description="Monotonic time of the reading (seconds).")
    cpu_usage_us: int = Field(..., ge=0, description="CPU time charged to the cgroup.")
    nr_periods: int | None = Field(None, ge=0, description="CFS enforcement periods elapsed.")
    nr_throttled: int | None = Field(None, ge=0, description="Periods in which the cgroup was throttled.")
    throttled_us: int | None = Field(None, ge=0, description="Total time throttled.")
    memory_current: int | None = Field(None, ge=0, description="Memory charged now.")
    memory_peak: int | None = Field(None, ge=0, description="Highest memory charged since creation (or last reset).")
    memory_limit_hits: int | None = Field(None, ge=0, description="v1 memory.failcnt; v2 memory.events `max`.")
    memory_high_events: int | None = Field(None, ge=0, description="v2 memory.events `high` (None on v1).")
    oom_events: int | None = Field(None, ge=0, description="v2 memory.events `oom`; v1 under_oom is a state, not a count.")
    oom_kills: int | None = Field(None, ge=0, description="Processes killed by the OOM killer (v1 memory.oom_control oom_kill, v2 memory.events oom_kill).")
    pids_current: int | None = Field(None, ge=0, description="Processes + threads now.")
    pids_peak: int | None = Field(None, ge=0, description="pids.peak where the kernel has it.")
    pids_limit_hits: int | None = Field(None, ge=0, description="pids.events `max`: forks refused at the limit.")
    psi_cpu: PSI | None = Field(None, description="Per-cgroup cpu.pressure (v2 or hybrid unified hierarchy).")
    psi_memory: PSI | None = Field(None, description="Per-cgroup memory.pressure.")
    psi_io: PSI | None = Field(None, description="Per-cgroup io.pressure.")
    io_read_bytes: int | None = Field(None, ge=0, description="Block I/O bytes read (v1 blkio.throttle.io_service_bytes, v2 io.stat).")
    io_write_bytes: int | None = Field(None, ge=0, description="Block I/O bytes written.")


class HostSnapshot(_M):
    """Host-wide contention signals at one instant (from /proc)."""

    t: float = Field(..., description="Monotonic time of the reading (seconds).")
    cpu_busy_us: dict[int, int] = Field(..., description="Per-CPU busy time (all states but idle/iowait; steal excluded).")
    cpu_total_us: dict[int, int] = Field(..., description="Per-CPU total time (all states).")
    steal_us: int = Field(0, ge=0, description="Steal time summed over all CPUs.")
    cpu_steal_us: dict[int, int] = Field(default_factory=dict, description="Per-CPU steal time (the pinned CPUs' is what the steal rule judges).")
    psi_cpu: PSI | None = Field(None, description="/proc/pressure/cpu.")
    psi_memory: PSI | None = Field(None, description="/proc/pressure/memory.")
    psi_io: PSI | None = Field(None, description="/proc/pressure/io.")
    mem_available: int = Field(..., ge=0, description="MemAvailable in bytes.")
    disk_bytes: int | None = Field(None, ge=0, description="Bytes read + written on the host's disks (/proc/diskstats, whole disks).")


def _d(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return None
    return max(0, b - a)


def _psi_d(a: PSI | None, b: PSI | None, attr: str) -> int | None:
    if a is None or b is None:
        return None
    va, vb = getattr(a, attr), getattr(b, attr)
    return _d(va, vb)


class CounterDelta(_M):
    """What one attempt suffered: start->end deltas of a cgroup plus peaks."""

    wall_s: float = Field(..., ge=0, description="Seconds between the two readings.")
    cpu_usage_us: int = Field(..., ge=0, description="CPU time used.")
    nr_periods: int | None = Field(None, description="CFS periods elapsed.")
    nr_throttled: int | None = Field(None, description="Periods throttled.")
    throttled_us: int | None = Field(None, description="Time throttled.")
    throttled_share: float | None = Field(None, description="throttled time / wall time.")
    memory_peak: int | None = Field(None, description="Peak memory (container lifetime).")
    memory_limit_hits: int | None = Field(None, description="Memory limit hits during the window.")
    memory_high_events: int | None = Field(None, description="memory.high events (v2).")
    oom_events: int | None = Field(None, description="OOM situations (v2).")
    oom_kills: int | None = Field(None, description="OOM kills during the window.")
    pids_peak: int | None = Field(None, description="Peak processes+threads (pids.peak, else max sampled).")
    pids_limit_hits: int | None = Field(None, description="Forks refused at the pids limit.")
    psi_cpu_some_us: int | None = Field(None, description="Per-cgroup cpu pressure stall time.")
    psi_memory_some_us: int | None = Field(None, description="Per-cgroup memory pressure stall time.")
    psi_memory_full_us: int | None = Field(None, description="Per-cgroup memory full-stall time.")
    psi_io_some_us: int | None = Field(None, description="Per-cgroup io pressure stall time.")
    io_read_bytes: int | None = Field(None, description="Block I/O bytes the attempt read from disk.")
    io_write_bytes: int | None = Field(None, description="Block I/O bytes the attempt wrote to disk.")

    @classmethod
    def between(cls, a: CgroupSnapshot, b: CgroupSnapshot, pids_peak_sampled: int | None = None) -> "CounterDelta":
        wall = max(0.0, b.t - a.t)
        thr = _d(a.throttled_us, b.throttled_us)
        peaks = [p for p in (b.pids_peak, pids_peak_sampled, b.pids_current) if p is not None]
        return cls(
            wall_s=wall,
            cpu_usage_us=max(0, b.cpu_usage_us - a.cpu_usage_us),
            nr_periods=_d(a.nr_periods, b.nr_periods),
            nr_throttled=_d(a.nr_throttled, b.nr_throttled),
            throttled_us=thr,
            throttled_share=(thr / (wall * 1e6)) if (thr is not None and wall > 0) else None,
            memory_peak=b.memory_peak,
            memory_limit_hits=_d(a.memory_limit_hits, b.memory_limit_hits),
            memory_high_events=_d(a.memory_high_events, b.memory_high_events),
            oom_events=_d(a.oom_events, b.oom_events),
            oom_kills=_d(a.oom_kills, b.oom_kills),
            pids_peak=max(peaks) if peaks else None,
            pids_limit_hits=_d(a.pids_limit_hits, b.pids_limit_hits),
            psi_cpu_some_us=_psi_d(a.psi_cpu, b.psi_cpu, "some_us"),
            psi_memory_some_us=_psi_d(a.psi_memory, b.psi_memory, "some_us"),
            psi_memory_full_us=_psi_d(a.psi_memory, b.psi_memory, "full_us"),
            psi_io_some_us=_psi_d(a.psi_io, b.psi_io, "some_us"),
            io_read_bytes=_d(a.io_read_bytes, b.io_read_bytes),
            io_write_bytes=_d(a.io_write_bytes, b.io_write_bytes),
        )


class HostDelta(_M):
    """Host contention over an attempt's window, normalized to shares of wall time."""

    wall_s: float = Field(..., ge=0, description="Seconds between the two readings.")
    pinned_cpus: list[int] = Field(default_factory=list, description="The trial's cpuset.")
    pinned_busy_us: int = Field(0, ge=0, description="Busy time on the pinned CPUs, all processes.")
    foreign_cpu_us: int = Field(0, ge=0, description="Busy time on the pinned CPUs not charged to the trial's cgroup.")
    foreign_cpu_share: float = Field(0.0, ge=0, description="foreign_cpu_us / (wall x pinned CPUs).")
    steal_share: float = Field(0.0, ge=0, description="Steal on the pinned CPUs / (wall x pinned CPUs); over all CPUs when unpinned or read without per-CPU steal.")
    psi_cpu_some_share: float | None = Field(None, description="Host cpu PSI some: stalled share of wall time.")
    psi_memory_some_share: float | None = Field(None, description="Host memory PSI some share.")
    psi_io_some_share: float | None = Field(None, description="Host io PSI some share.")
    mem_available_min: int | None = Field(None, description="Lowest MemAvailable seen (bytes).")
    disk_bytes: int | None = Field(None, description="Bytes read + written on the host's disks over the window.")
    monitor_stall_s: float | None = Field(None, description="Longest gap in the monitor's samples beyond one sampling "
                                          "interval (seconds): how long the controller itself stood still.")

    @classmethod
    def between(
        cls,
        a: HostSnapshot,
        b: HostSnapshot,
        pinned: list[int],
        cgroup_cpu_us: int,
        mem_available_min: int | None = None,
    ) -> "HostDelta":
        wall = max(1e-9, b.t - a.t)
        busy = sum(max(0, b.cpu_busy_us.get(c, 0) - a.cpu_busy_us.get(c, 0)) for c in pinned)
        foreign = max(0, busy - cgroup_cpu_us)
        ncpu = max(1, len(b.cpu_total_us))

        # steal on the trial's own cores: steal elsewhere grows with how busy those cores are (the
        # controller's, serving a flood of output), which an agent would choose; all CPUs' sum
        # only when a snapshot has no per-CPU steal (an older record)
        if pinned and all(c in a.cpu_steal_us and c in b.cpu_steal_us for c in pinned):
            steal, steal_cpus = sum(max(0, b.cpu_steal_us[c] - a.cpu_steal_us[c]) for c in pinned), len(pinned)
        else:
            steal, steal_cpus = max(0, b.steal_us - a.steal_us), ncpu

        def share(x: PSI | None, y: PSI | None) -> float | None:
            if x is None or y is None:
                return None
            return max(0, y.some_us - x.some_us) / (wall * 1e6)

        mins = [v for v in (a.mem_available, b.mem_available, mem_available_min) if v is not None]
        return cls(
            wall_s=max(0.0, b.t - a.t),
            pinned_cpus=list(pinned),
            pinned_busy_us=busy,
            foreign_cpu_us=foreign,
            foreign_cpu_share=foreign / (wall * 1e6 * max(1, len(pinned))) if pinned else 0.0,
            steal_share=steal / (wall * 1e6 * steal_cpus),
            psi_cpu_some_share=share(a.psi_cpu, b.psi_cpu),
            psi_memory_some_share=share(a.psi_memory, b.psi_memory),
            psi_io_some_share=share(a.psi_io, b.psi_io),
            mem_available_min=min(mins) if mins else None,
            disk_bytes=max(0, b.disk_bytes - a.disk_bytes) if a.disk_bytes is not None and b.disk_bytes is not None else None,
        )


class Sample(_M):
    """One row of the saturation log (rates over the previous sample interval)."""

    t: float = Field(..., description="Seconds since the attempt's agent phase started.")
    cpu_usage_us: int = Field(..., description="Cumulative cgroup CPU time.")
    throttled_us: int | None = Field(None, description="Cumulative throttled time.")
    nr_throttled: int | None = Field(None, description="Cumulative throttled periods.")
    memory_current: int | None = Field(None, description="Memory charged now.")
    pids_current: int | None = Field(None, description="Processes + threads now.")
    foreign_cpu_us: int | None = Field(None, description="Cumulative foreign busy time on the pinned CPUs.")
    host_mem_available: int | None = Field(None, description="Host MemAvailable.")
