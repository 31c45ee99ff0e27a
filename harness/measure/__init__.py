"""Measuring: cgroup v1/v2 and /proc parsing (pure) and readers (files), and the monitor
that samples a sandbox while it runs."""
