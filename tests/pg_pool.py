"""PostgreSQL databases for the tests, copied from the migrated template once per worker and
then emptied back to the template's state between tests, instead of created and dropped for
every test.

Why: a `CREATE DATABASE ... TEMPLATE` copies every block of the new database through the
write-ahead log (PostgreSQL 15's WAL_LOG strategy: the system catalogs alone are about
8 MB), and `DROP DATABASE` removes them again; together about 0.2-0.4 s of the server's CPU
and 0.3-1 s of a test's wall time on this 2-core machine, for each of the suite's 700-odd
tests on PostgreSQL. Emptying a used database costs about 25 ms: a `DELETE` per table
(children before parents), the template's own rows put back and every sequence set to
the template's value, in one transaction.

What a test gets is what it got before: a database nobody else is connected to, whose
schema, rows and sequences are the template's. A database is put back only when that
holds:
- every other connection to it is ended first (as `DROP DATABASE ... WITH (FORCE)` did), so
  a server or agent a test left behind cannot write into the next test's database;
- its schema must still be the template's (tables, columns, indexes, constraints,
  triggers and whether they are enabled, functions, views, grants, namespaces, the
  database's own settings): a test that added a trigger, altered a table or renamed a
  column leaves a database that is dropped instead, and the next test gets a new copy.
Anything that fails while emptying it drops it too. A test never sees a database another
worker uses: each worker keeps its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

# One text for a database's whole schema, compared with the template's before a database
# is put back. What a test could change and the next one would notice.
_FINGERPRINT = """
SELECT md5(string_agg(x, E'\\n' ORDER BY x)) FROM (
  SELECT 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text || ' '
         || coalesce(c.relacl::text, '') || ' ' || coalesce(c.reloptions::text, '') || ' '
         || c.relrowsecurity::text || ' ' || coalesce((
           SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                             || ' ' || a.attnotnull::text || ' '
                             || coalesce(pg_get_expr(d.adbin, d.adrelid), ''),
                             ', ' ORDER BY a.attnum)
           FROM pg_attribute a LEFT JOIN pg_attrdef d
             ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '') AS x
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%'
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' '
         || pg_get_constraintdef(k.oid)
    FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
    FROM pg_trigger t WHERE NOT t.tgisinternal
  UNION ALL
  SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'rule ' || r.rulename || ' ' || r.ev_class::regclass::text FROM pg_rewrite r
    JOIN pg_class c ON c.oid = r.ev_class JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'type ' || t.typname || ' ' || t.typtype::text FROM pg_type t
    JOIN pg_namespace n ON n.oid = t.typnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL
  SELECT 'setting ' || array_to_string(s.setconfig, ',') FROM pg_db_role_setting s
    WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL
  SELECT 'namespace ' || nspname FROM pg_namespace
) AS parts
"""

# Tables in the order their rows can be deleted: a table before every table it refers to.
_TABLES = """
SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public'
"""
_REFERENCES = """
SELECT conrelid, confrelid FROM pg_constraint WHERE contype = 'f' AND conrelid <> confrelid
"""
_SEQUENCES = """
SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename),
       coalesce(last_value, start_value), last_value IS NOT NULL
FROM pg_sequences WHERE schemaname = 'public'
"""


@dataclass
class Template:
    """What a database copied from the template holds, read from the template once."""

    fingerprint: str
    # Children before parents.
    tables: list[str]
    # The template's own rows (table, each row as JSON).
    rows: list[tuple[str, str]]
    # (sequence, value, called): the template's sequences, for setval.
    sequences: list[tuple[str, int, bool]]

    @classmethod
    def read(cls, url: str) -> Template:
        with psycopg.connect(url, autocommit=True) as conn:
            fingerprint = conn.execute(_FINGERPRINT).fetchone()
            names: dict[int, str] = dict(conn.execute(_TABLES).fetchall())
            refers: dict[int, set[int]] = {oid: set() for oid in names}
            for child, parent in conn.execute(_REFERENCES).fetchall():
                if child in refers and parent in names:
                    refers[child].add(parent)
            rows = [
                (names[oid], row)
                for oid in names
                for (row,) in conn.execute(
                    sql.SQL("SELECT row_to_json(t)::text FROM {} AS t").format(sql.SQL(names[oid]))
                ).fetchall()
            ]
            sequences = [(s, int(v), bool(c)) for s, v, c in conn.execute(_SEQUENCES).fetchall()]
        assert fingerprint is not None
        return cls(str(fingerprint[0]), _children_first(names, refers), rows, sequences)


def _children_first(names: dict[int, str], refers: dict[int, set[int]]) -> list[str]:
    """Every table before the tables it refers to (depth first from each table)."""
    order: list[int] = []
    done: set[int] = set()

    def visit(oid: int, path: frozenset[int]) -> None:
        if oid in done or oid in path:
            return
        # A table is listed after every table that refers to it.
        for child, parents in refers.items():
            if oid in parents:
                visit(child, path | {oid})
        done.add(oid)
        order.append(oid)

    for oid in sorted(names, key=names.__getitem__):
        visit(oid, frozenset())
    return [names[oid] for oid in order]


def url_of(name: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _libpq(name: str) -> str:
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


@dataclass
class Pool:
    """One worker's databases copied from ``template_name``; a database is lent to one test
    at a time and emptied before it is lent again."""

    admin: str
    template_name: str
    template: Template
    free: list[str] = field(default_factory=list)

    @contextmanager
    def database(self, prefix: str = "llmgw_t") -> Iterator[str]:
        name = self.free.pop() if self.free else self._copy(prefix)
        kept = False
        try:
            yield url_of(name)
        finally:
            kept = self._empty(name)
            if kept:
                self.free.append(name)
            else:
                self._drop(name)

    def close(self) -> None:
        while self.free:
            self._drop(self.free.pop())

    def _copy(self, prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template_name)
                )
            )
        return name

    def _drop(self, name: str) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def _empty(self, name: str) -> bool:
        """Back to the template's state, alone: True, or False if it cannot be (drop it)."""
        try:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                # Every other session ended, and waited for (PostgreSQL 14's timeout
                # argument), so that their locks are gone and nothing writes afterwards.
                ended = conn.execute(
                    "SELECT bool_and(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                ).fetchone()
                if ended is None or ended[0] is False:
                    return False
            with psycopg.connect(_libpq(name)) as conn:
                conn.execute("SET lock_timeout = '10s'")
                # Nobody waits on this database's commits being durable: a crash drops it.
                conn.execute("SET synchronous_commit = off")
                found = conn.execute(_FINGERPRINT).fetchone()
                if found is None or found[0] != self.template.fingerprint:
                    return False
                for table in self.template.tables:
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.SQL(table)))
                for table, row in self.template.rows:
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {0} SELECT * FROM json_populate_record(NULL::{0}, %s)"
                        ).format(sql.SQL(table)),
                        (row,),
                    )
                for sequence, value, called in self.template.sequences:
                    conn.execute("SELECT setval(%s, %s, %s)", (sequence, value, called))
                conn.commit()
            return True
        except psycopg.Error:
            return False
