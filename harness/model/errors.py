"""One error tree. Every error the harness raises on purpose is a :class:`HarnessError`;
its class says who must act and carries the exit code the CLI maps it to (in one place,
``harness.cli.app``):

* :class:`UsageError` (exit 2): the input is wrong (option, suite or profile file, unknown
  id). Nothing was written.
* :class:`CheckFailed` (exit 1): everything ran, and a check did not hold (gate, doctor).
* :class:`InfraError` (exit 3): the machine failed us (engine down, image build failed,
  store lost mid-run).

Messages name the object and the next step, on one line where possible.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""

    exit_code: int = 1


class UsageError(HarnessError):
    """Bad input: an option, a suite or profile file, an unknown id. Exit 2, nothing written."""

    exit_code = 2


class CheckFailed(HarnessError):
    """A check (gate, doctor) did not hold. Exit 1."""

    exit_code = 1


class InfraError(HarnessError):
    """The infrastructure failed: engine, image build, store. Exit 3."""

    exit_code = 3


# ---- usage errors, by what was wrong


class ProfileError(UsageError):
    """A profile that cannot be used; the message names the file and the key."""


class SuiteError(UsageError):
    """A suite that cannot be used. One line per problem: ``file: key: message``."""


class RunError(UsageError):
    """A run cannot start or resume as asked (bad options, missing image, changed suite)."""


class NothingToRun(RunError):
    """No task of the suite can run here (``excluded``: task id -> why)."""

    def __init__(self, message: str, excluded: dict[str, str]):
        super().__init__(message)
        self.excluded = dict(excluded)


class NotBuildableHere(UsageError):
    """A Dockerfile this harness cannot build as written: a base image with no local
    equivalent (``--base-map`` it), BuildKit-only syntax, no Dockerfile. The suite's or the
    caller's to fix, not the infrastructure's, so exit 2."""


class SchedulerError(UsageError):
    """The envelope cannot be scheduled on this machine; the message says what would fit."""


class StoreError(UsageError):
    """The store cannot be opened as asked (no database, unknown run, read-only); one line."""


# ---- infrastructure errors


class ClusterError(InfraError):
    """The Ray cluster cannot be joined (nothing answers, refused, authentication)."""


class EngineError(InfraError):
    """The Docker engine cannot be reached or refused a request; the message says what to do."""


class SandboxError(InfraError):
    """A sandbox could not be created or used (image missing, engine error, cgroup not found)."""


class ImageBuildError(InfraError):
    """An image could not be built; the message says which and why."""


class StoreLost(InfraError):
    """The store failed under a running run (deleted, replaced, disk full, server gone)."""


class LeaseTimeout(InfraError):
    """No cores could be leased within the wait (another controller holds them)."""
