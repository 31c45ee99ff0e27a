"""harness: an eval harness that measures agent reliability in resource-pinned Docker sandboxes."""

__version__ = "0.1.0"
