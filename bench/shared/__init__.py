"""What every benchmark area shares, and measures nothing of its own.

``common`` (timing, tables, the machine, where caches live, PostgreSQL scratch
databases), ``gen`` (realistic event logs, written in bulk and cached), ``ab`` (before and
after in one run against another tree of the packages: ``python -m bench.shared.ab
BASE_TREE``).

How to compare against an older tree: docs/benchmarks/index.md.
"""
