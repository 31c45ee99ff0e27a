"""CLI commands that read the store: report, gate, compare (registered on import)."""
