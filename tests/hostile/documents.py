"""Hostile documents, built once here for every test that sends or stores one."""

from __future__ import annotations

import itertools


def alias_bomb(field: str = "aliases", levels: int = 9, width: int = 9, **head: str) -> str:
    """The ~400-byte YAML "billion laughs" under ``field`` of a mapping: each level is
    ``width`` aliases of the one before, so it describes ``width ** levels`` strings
    (387 million by default), which anything that walks it (a validator, ``repr``,
    a check for NUL characters) expands."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{key}: {value}" for key, value in head.items()]
    lines.append(f"{field}:")
    lines.append(f"  - &{names[0]} [" + ",".join(["lol"] * width) + "]")
    for prev, cur in itertools.pairwise(names):
        lines.append(f"  - &{cur} [" + ",".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def model_bomb() -> str:
    """A model definition whose aliases are the bomb."""
    return alias_bomb(
        "aliases", name="bomb", source="org/bomb", profiles="[{name: t4, gpu_class: T4}]"
    )


def node_bomb() -> str:
    """A node report whose fabric is the bomb."""
    return alias_bomb("fabric", gpu_class="T4", gpus="4")


def deep_json_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_definition(depth: int) -> str:
    """A model definition (JSON) with one field nested ``depth`` levels deep."""
    return (
        '{"name": "deep", "source": "org/deep", "profiles": [{"name": "t4", "gpu_class": "T4"}], '
        f'"capabilities": {deep_json_array(depth)}}}'
    )
