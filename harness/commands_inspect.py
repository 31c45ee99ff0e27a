"""CLI commands to inspect attempts: trials, show, samples, gc (registered on import)."""
