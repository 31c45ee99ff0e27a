"""The engine: loading suites and profiles, the attempt pipeline, core leases, executors,
the run driver, sweeps, gc, doctor and event sinks."""
