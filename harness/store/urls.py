"""Where the store is: the database URL (``--db``, ``HARNESS_DB``, else the default SQLite
file under ``HARNESS_HOME``) and the SQLite file it names. No database driver is imported."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = ".harness"


def harness_home() -> Path:
    """Project-local folder for the default database, run artifacts and input folders (HARNESS_HOME)."""
    return Path(os.environ.get("HARNESS_HOME", DEFAULT_HOME))


def default_url() -> str:
    return os.environ.get("HARNESS_DB") or f"sqlite:///{harness_home() / 'harness.db'}"


def missing_database(url: str | None) -> Path | None:
    """The SQLite file ``url`` (default: the configured store) names, when it does not exist yet."""
    path = sqlite_path(url or default_url())
    return path if path is not None and not path.exists() else None


def is_default_store(path: Path) -> bool:
    """Whether ``path`` is the default store's file (HARNESS_HOME/harness.db). Before the first
    run it does not exist, and reading it finds nothing; a database named anywhere else (--db,
    HARNESS_DB) that does not exist is a mistyped path."""
    return path.absolute() == (harness_home() / "harness.db").absolute()


def url_hint(url: str) -> str:
    """What a mistyped database URL most likely meant, as '; ...' ('' when nothing stands out)."""
    path = sqlite_path(url)
    if path is not None and not path.is_absolute():
        return (f"; sqlite:/// with three slashes names a path relative to the working directory ({Path.cwd() / path}); "
                f"an absolute path takes four: sqlite:////{path}")
    if "://" not in url:
        return f"; a database URL names its kind first: sqlite:///{url} for a SQLite file, postgresql+psycopg://USER@HOST/DB for PostgreSQL"
    return ""


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (None for any other database, or SQLite in memory)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path, _, query = url.removeprefix("sqlite:///").partition("?")
        if path.startswith("file:") and "uri=true" in query:  # an SQLite URI: file:/abs, file:rel, file:///abs
            path = path.removeprefix("file:")
            if path.startswith(":memory:") or "mode=memory" in query:
                return None
            if path.startswith("///"):
                path = path[2:]
        return Path(path)
    return None
