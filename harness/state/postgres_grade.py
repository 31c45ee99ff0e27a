"""The PostgreSQL grader program: runs INSIDE the attempt's database service, never in the controller.

``python3 -I -S postgres_grade.py SPEC.json`` in the service container (as its ``postgres``
user, over the local socket), after every agent process is gone, under the grade envelope.
Standard library plus the image's ``psycopg2``; :mod:`sqlite_grade` is copied beside it.

The service holds two databases: ``fixture`` (seeded by the harness from the suite's SQL,
never reachable by the agent's role) and ``app`` (the same seed, then whatever the agent
did). Expectations are run on ``app`` itself, read-only, so they speak PostgreSQL. For the
extra-effects diff both databases are mirrored into SQLite files (same tables, columns and
primary keys; values converted the same way on both sides) and compared by the same code as
the ``sqlite`` kind; schema objects (indexes, triggers, views, functions, constraints,
schemas, column types) are compared from PostgreSQL's own catalog definitions. One verdict
goes to stdout.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import sqlite3
import sys
import tempfile
import traceback
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sqlite_grade as g  # noqa: E402  (copied beside this file)

SOCKET_DIR = "/pg/run"
SYSTEM = ("pg_catalog", "information_schema", "pg_toast")
EXIT_BROKEN = 70


# The agent's role owns `app` and may have set session defaults on it (ALTER DATABASE app SET
# search_path = its_schema, ...) or put look-alike catalogs, functions and operators in its
# schemas. Options given at connection start override database and role settings: the
# grader's sessions resolve unqualified names in pg_catalog only, and run the task's
# expectations as the agent's own role (never as the superuser) with `public` searched after
# pg_catalog. Database and role settings the agent added are part of the schema diff.
PINNED = "-c search_path=pg_catalog,pg_temp -c default_transaction_read_only=on -c session_replication_role=origin"
AGENT_ROLE = "agent"


def connect(dbname: str) -> Any:
    import psycopg2

    conn = psycopg2.connect(host=SOCKET_DIR, dbname=dbname, user="postgres", options=PINNED)
    conn.set_session(readonly=True, autocommit=False)
    return conn


def stop_agent_sessions() -> None:
    """No agent session may change the database while it is graded: the role can no longer log
    in and its sessions are ended (a DO loop left running would otherwise keep writing)."""
    import psycopg2

    conn = psycopg2.connect(host=SOCKET_DIR, dbname="postgres", user="postgres", options="-c search_path=pg_catalog,pg_temp")
    conn.autocommit = True
    try:
        with conn.cursor() as c:
            c.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (AGENT_ROLE,))
            if c.fetchone():
                c.execute(f'ALTER ROLE "{AGENT_ROLE}" NOLOGIN')
            c.execute("SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity "
                      "WHERE usename = %s AND pid <> pg_catalog.pg_backend_pid()", (AGENT_ROLE,))
    finally:
        conn.close()


def value(v: Any) -> Any:
    """A PostgreSQL value as both sides of the diff store it (and as expectations compare it)."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() and v.is_finite() else float(v)
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (dt.timedelta, uuid.UUID)):
        return str(v)
    return json.dumps(v, sort_keys=True, default=str)


_AFFINITY = {"smallint": "INTEGER", "integer": "INTEGER", "bigint": "INTEGER", "boolean": "INTEGER", "numeric": "NUMERIC",
             "real": "REAL", "double precision": "REAL", "bytea": "BLOB"}


def tables(conn: Any) -> list[tuple[str, str]]:
    with conn.cursor() as c:
        c.execute("SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN %s ORDER BY 1, 2", (SYSTEM,))
        return c.fetchall()


def _label(schema: str, table: str) -> str:
    return table if schema == "public" else f"{schema}.{table}"


def mirror(conn: Any, path: str) -> None:
    """Copy every table of ``conn`` into a SQLite file: columns, primary key, rows."""
    out = sqlite3.connect(path)
    for schema, table in tables(conn):
        with conn.cursor() as c:
            c.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                      "ORDER BY ordinal_position", (schema, table))
            cols = c.fetchall()
            c.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                      "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
                      (f'"{schema}"."{table}"',))
            pk = [r[0] for r in c.fetchall()]
        name = _label(schema, table)
        decl = [f"{g._ident(col)} {_AFFINITY.get(typ, 'TEXT')}" for col, typ in cols]
        if pk:
            decl.append(f"PRIMARY KEY ({', '.join(g._ident(k) for k in pk)})")
        out.execute(f"CREATE TABLE {g._ident(name)} ({', '.join(decl) or 'dummy'})")
        if not cols:
            continue
        sel = f'SELECT {", ".join(chr(34) + col.replace(chr(34), chr(34) * 2) + chr(34) for col, _ in cols)} FROM "{schema}"."{table}"'
        ins = f"INSERT INTO {g._ident(name)} VALUES ({', '.join('?' for _ in cols)})"
        with conn.cursor(name=f"harness_{len(name)}_{abs(hash(name))}") as c:
            c.itersize = 2000
            c.execute(sel)
            batch = []
            for row in c:
                batch.append(tuple(value(v) for v in row))
                if len(batch) >= 2000:
                    out.executemany(ins, batch)
                    batch.clear()
            if batch:
                out.executemany(ins, batch)
    out.commit()
    out.close()


def catalog(conn: Any) -> dict[tuple[str, str], str]:
    """(kind, name) -> definition of every schema object the agent could add or change."""
    queries = {
        "schema": "SELECT nspname, nspname FROM pg_namespace WHERE nspname NOT IN %s AND nspname NOT LIKE 'pg_temp%%' "
                  "AND nspname NOT LIKE 'pg_toast_temp%%'",
        "index": "SELECT schemaname || '.' || indexname, indexdef FROM pg_indexes WHERE schemaname NOT IN %s",
        "trigger": "SELECT t.tgname || ' on ' || t.tgrelid::regclass::text, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                   "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE NOT t.tgisinternal AND n.nspname NOT IN %s",
        "view": "SELECT schemaname || '.' || viewname, definition FROM pg_views WHERE schemaname NOT IN %s",
        "function": "SELECT n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', "
                    "pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname NOT IN %s AND p.prokind IN ('f', 'p')",
        "constraint": "SELECT c.conname || ' on ' || c.conrelid::regclass::text, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                      "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname NOT IN %s AND c.conrelid <> 0",
        "column": "SELECT table_schema || '.' || table_name || '.' || column_name, data_type || coalesce('(' || "
                  "character_maximum_length || ')', '') || ' null=' || is_nullable || ' default=' || coalesce(column_default, '') "
                  "FROM information_schema.columns WHERE table_schema NOT IN %s",
        "policy": "SELECT schemaname || '.' || tablename || '.' || policyname, coalesce(qual, '') || ' ' || coalesce(with_check, '') "
                  "FROM pg_policies WHERE schemaname NOT IN %s",
    }
    out: dict[tuple[str, str], str] = {}
    with conn.cursor() as c:
        for kind, q in queries.items():
            c.execute(q, (SYSTEM,))
            for name, definition in c.fetchall():
                out[(kind, name)] = " ".join(str(definition or "").split())
    return out


def settings(conn: Any) -> list[str]:
    """Session defaults set on the agent's database or role (ALTER DATABASE / ROLE ... SET): the
    seed sets none, and they live in a catalog both databases share, so any is a change."""
    with conn.cursor() as c:
        c.execute("SELECT coalesce(d.datname, 'every database'), coalesce(r.rolname, 'every role'), "
                  "array_to_string(s.setconfig, ', ') FROM pg_db_role_setting s "
                  "LEFT JOIN pg_database d ON d.oid = s.setdatabase LEFT JOIN pg_roles r ON r.oid = s.setrole "
                  "WHERE d.datname = 'app' OR r.rolname = %s", (AGENT_ROLE,))
        return [f"new setting on database {db}, role {role}: {g._one_line(conf, 160)}" for db, role, conf in c.fetchall()]


def schema_changes(fx: Any, st: Any) -> list[str]:
    a, b = catalog(fx), catalog(st)
    out = settings(st)
    for kind, name in sorted(set(a) | set(b)):
        if kind == "column":  # added or dropped columns (and tables) are in the table diff; a changed type is here
            if (kind, name) in a and (kind, name) in b and a[(kind, name)] != b[(kind, name)]:
                out.append(f"column {g._name(name)} redefined: {g._one_line(b[(kind, name)], 160)}")
            continue
        if (kind, name) not in a:
            out.append(f"new {kind} {g._name(name)}")
        elif (kind, name) not in b:
            out.append(f"{kind} {g._name(name)} dropped")
        elif a[(kind, name)] != b[(kind, name)]:
            out.append(f"{kind} {g._name(name)} redefined: {g._one_line(b[(kind, name)], 160)}")
    return out


def run_query(conn: Any):
    def run(query: str) -> tuple[list[str], list[tuple]]:
        with conn.cursor() as c:
            # the task's SQL runs with the agent's privileges: nothing the agent defined runs as superuser
            c.execute(f'SET LOCAL ROLE "{AGENT_ROLE}"')
            c.execute("SET LOCAL search_path = pg_catalog, public, pg_temp")
            c.execute(query)
            cols = [d[0] for d in c.description or []]
            return cols, [tuple(value(v) for v in r) for r in c.fetchmany(g.MAX_QUERY_ROWS + 1)]
    return run


def keep_dump(spec: dict[str, Any]) -> None:
    """The final database as SQL, kept as evidence (best effort, within a share of the grade time)."""
    import subprocess

    path = spec.get("dump_path")
    if not path:
        return
    try:
        subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "-h", SOCKET_DIR, "-U", "postgres", "-d", "app", "-f", path],
                       timeout=float(spec.get("dump_timeout_s") or 10), capture_output=True)
    except (OSError, subprocess.SubprocessError):
        pass


def grade(spec: dict[str, Any]) -> dict[str, Any]:
    import psycopg2

    stop_agent_sessions()
    fx = connect("fixture")
    try:
        try:
            st = connect("app")
        except psycopg2.Error as e:
            return g.ungradable(f"the final database cannot be opened: {g._one_line(str(e))}")
        final = False  # past the fixture's mirror, what breaks is the final database's doing
        try:
            timeout_ms = int(spec.get("statement_timeout_ms") or 0)
            with st.cursor() as c:
                if timeout_ms:
                    c.execute(f"SET statement_timeout = {timeout_ms}")
            results = []
            final = True
            for exp in spec.get("expect") or []:
                results.append(g.check_with(run_query(st), exp, psycopg2.Error))
                st.rollback()
            with tempfile.TemporaryDirectory(prefix="harness-pg-grade-", dir=spec.get("scratch") or None) as tmp:
                final = False
                mirror(fx, os.path.join(tmp, "fixture.db"))
                final = True
                try:
                    mirror(st, os.path.join(tmp, "final.db"))
                except sqlite3.Error as e:  # e.g. two tables whose names differ only in case
                    return g.ungradable(f"the final database cannot be compared with the fixture: {g._one_line(str(e))} "
                                        "(names that differ only in case are one name to the comparison)")
                schema = schema_changes(fx, st)
                f_conn = g.open_fixture(os.path.join(tmp, "fixture.db"))
                s_conn = g.open_fixture(os.path.join(tmp, "final.db"))
                try:
                    verdict = g.grade_connections(spec, f_conn, s_conn, expectations=results, schema=schema)
                finally:
                    f_conn.close()
                    s_conn.close()
            keep_dump(spec)
            return verdict
        except psycopg2.Error as e:
            return g.ungradable(f"the final database cannot be read within the grade envelope: {g._one_line(str(e))}")
        except Exception as e:  # noqa: BLE001 - on the final database: graded, never a discard the agent could choose
            if not final:
                raise
            traceback.print_exc(limit=4, file=sys.stderr)
            return g.ungradable(f"the grader could not read the final database ({type(e).__name__}: {g._one_line(str(e), 160)})")
        finally:
            st.close()
    finally:
        fx.close()


def main(argv: list[str]) -> int:
    try:
        with open(argv[1], encoding="utf-8") as f:
            spec = json.load(f)
        verdict = grade(spec)
    except MemoryError:
        verdict = g.ungradable("the final database cannot be read within the grade envelope (MemoryError)")
    except Exception:  # the grader broke on something it trusts (the fixture database): not the agent's fault
        traceback.print_exc(limit=4, file=sys.stderr)
        return EXIT_BROKEN
    sys.stdout.write(g.fit(verdict))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
