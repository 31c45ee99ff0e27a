"""harness: an eval harness that measures agent reliability in resource-pinned Docker sandboxes."""

import os as _os

__version__ = "0.1.0"

# the CPUs this process could run on when harness was first imported (taskset, a container's
# cpuset), before the console script kept it to its reserved cores: what trials may use is
# read from this (harness.engine.scheduler.allowed_cpus), never from the pinned affinity
START_CPUS: tuple[int, ...] = tuple(sorted(_os.sched_getaffinity(0)))
