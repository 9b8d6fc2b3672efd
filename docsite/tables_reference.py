"""Every table this release defines, with its columns, from the SQLAlchemy metadata.

The Alembic migrations create exactly these (a test holds them to it: ``alembic check``),
so this is the schema a database at head has.
"""

from __future__ import annotations


def render() -> str:
    import scheduler.persistence.tables  # noqa: F401  (registers the scheduler's tables)
    from events.database.tables import Base

    lines: list[str] = []
    for table in Base.metadata.sorted_tables:
        doc = " ".join((getattr(_mapped(table.name), "__doc__", "") or "").split())
        lines += [f"### `{table.name}`", ""]
        if doc:
            lines += [doc, ""]
        lines += ["| column | type | null | key |", "|---|---|---|---|"]
        for column in table.columns:
            key = "primary" if column.primary_key else ("indexed" if column.index else "")
            if column.unique:
                key = "unique"
            lines.append(
                f"| `{column.name}` | {_type(column.type)} | {'yes' if column.nullable else 'no'} "
                f"| {key} |"
            )
        lines.append("")
    return "\n".join(lines)


def _type(kind: object) -> str:
    variant = getattr(kind, "impl", kind)
    return str(variant).lower().replace("|", "\\|")


def _mapped(name: str) -> type | None:
    from events.database.tables import Base

    for mapper in Base.registry.mappers:
        if getattr(mapper.class_, "__tablename__", None) == name:
            cls: type = mapper.class_
            return cls
    return None


if __name__ == "__main__":
    print(render())
