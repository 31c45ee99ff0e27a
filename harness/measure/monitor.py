"""The monitor: samples a sandbox's cgroup and the host's counters in a background thread
(the saturation log). Cheap by design: a handful of small file reads per sample, no engine
API calls. A read error never ends it silently: it is counted and the last one kept."""

from __future__ import annotations

import threading
import time
from typing import Callable

from harness.measure.cgroup import SampleCounters, SnapshotReader
from harness.measure.host import HostSampler
from harness.model.counters import CgroupSnapshot, HostSnapshot, Sample


class Monitor:
    """Samples the cgroup and host counters in a background thread (the saturation log).

    Cheap by design: five or six small file reads per sample (only the counters a sample
    keeps; the host's pinned CPUs and MemAvailable), each one ``pread`` of a file the
    sampling thread holds open from its start to its end (:meth:`SnapshotReader.held`,
    :class:`HostSampler`), no Docker API calls. ``reader``: a :class:`SnapshotReader`, or any
    callable that returns :class:`SampleCounters` (read as it is). A sample that cannot be
    read is counted in ``errors`` (with ``last_error``); sampling goes on."""

    def __init__(self, reader: SnapshotReader | Callable[[], SampleCounters], pinned: list[int], hz: float,
                 host: HostSampler | None = None):
        self._source = reader
        self._reader: Callable[[], SampleCounters] = reader.sample if isinstance(reader, SnapshotReader) else reader
        self._pinned = pinned
        self._own_host = host is None  # then the sampling thread closes it when it ends
        self._host = host or HostSampler(pinned)
        self._interval = 1.0 / hz
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="harness-monitor", daemon=True)
        self._rows: list[tuple[float, int, int | None, int | None, int | None, int | None, int, int]] = []
        self._built: list[Sample] = []
        self._building = threading.Lock()  # two readers of `samples` never build a row twice
        self.mem_available_min: int | None = None
        self.pids_peak: int | None = None
        self.t0 = time.monotonic()
        self._host0: HostSnapshot | None = None
        self._cg0: CgroupSnapshot | None = None
        self.errors = 0  # samples lost to a read error (the thread goes on)
        self.last_error: str | None = None
        self._last_tick: float | None = None
        self.max_gap = 0.0  # the longest time between two turns of the sampling loop (start and stop included)

    def start(self, t0: float, host0: HostSnapshot, cg0: CgroupSnapshot) -> None:
        self.t0, self._host0, self._cg0 = t0, host0, cg0
        self._last_tick = time.monotonic()
        self._thread.start()

    def _tick(self) -> None:
        now = time.monotonic()
        if self._last_tick is not None:
            self.max_gap = max(self.max_gap, now - self._last_tick)
        self._last_tick = now

    @property
    def samples(self) -> list[Sample]:
        """The saturation log so far, oldest first (the same list, grown, on each read)."""
        rows, built = self._rows, self._built
        with self._building:
            # the values are this module's own ints (parsed from kernel files), so no validation
            for t, cpu, thr, nr, mem, pids, foreign, avail in rows[len(built):len(rows)]:
                built.append(Sample.model_construct(t=t, cpu_usage_us=cpu, throttled_us=thr, nr_throttled=nr, memory_current=mem,
                                                    pids_current=pids, foreign_cpu_us=foreign, host_mem_available=avail))
        return built

    @property
    def stall_s(self) -> float:
        """How long the controller stood still beyond one sampling interval (0 when it never did)."""
        return max(0.0, self.max_gap - self._interval)

    def _sample(self, read: Callable[[], SampleCounters]) -> None:
        t = time.monotonic()
        cg = read()  # an error here (the cgroup going away) is counted by _loop
        now, then = self._host.busy_us(), self._host0.cpu_busy_us
        busy = sum(now.get(c, 0) - then.get(c, 0) for c in self._pinned)
        foreign = max(0, busy - (cg.cpu_usage_us - self._cg0.cpu_usage_us))
        avail = self._host.mem_available()
        # a plain tuple on the 5 Hz path (a model built in a thread that wakes cold costs more
        # than the reads); `samples` builds the models when the log is read
        self._rows.append((round(t - self.t0, 4), cg.cpu_usage_us, cg.throttled_us, cg.nr_throttled, cg.memory_current,
                           cg.pids_current, foreign, avail))
        if self.mem_available_min is None or avail < self.mem_available_min:
            self.mem_available_min = avail
        if cg.pids_current is not None and (self.pids_peak is None or cg.pids_current > self.pids_peak):
            self.pids_peak = cg.pids_current

    def _loop(self) -> None:
        held = self._source.held() if isinstance(self._source, SnapshotReader) else None
        read = held.sample if held is not None else self._reader
        try:
            while not self._stop.wait(self._interval):
                self._tick()
                try:
                    self._sample(read)
                except Exception as e:  # a bad read (host file, parse) costs one sample, never the log
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {str(e)[:200]}"
        finally:  # the descriptors live as long as the thread that reads them
            if held is not None:
                held.close()
            if self._own_host:
                self._host.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._tick()
