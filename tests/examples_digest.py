"""Which examples each property test was given: a pytest plugin that
``scripts/same-examples`` loads (``-p tests.examples_digest``) in two trees (issue 37).

Why: a property test's strategies can be made cheaper to draw (built once rather than in
every draw, say) without changing what they draw. Hypothesis draws an example from a
sequence of choices; run derandomised, the same strategies make the same choices, so the
same test gets the same examples. This records them, so that a change meant to cost less
is shown to test the same things: ``scripts/same-examples`` runs the tests in a tree
before the change and in this one, both derandomised, and compares what each was given.

How: Hypothesis's observability callback reports every test case it runs, with the
representation of its arguments. Each process appends one JSON line a test case to
``<dir>/<worker>.jsonl`` (the directory LLMGW_HYPOTHESIS_EXAMPLES names):
``{"property", "status", "arguments"}``, in the order run.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import IO, Any

import pytest

_VARIABLE = "LLMGW_HYPOTHESIS_EXAMPLES"
# An object printed by its default repr carries its address, which differs run to run.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def pytest_configure(config: pytest.Config) -> None:
    directory = os.environ.get(_VARIABLE)
    if not directory:
        return
    from hypothesis.internal.observability import add_observability_callback

    Path(directory).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out: IO[str] = open(Path(directory) / f"{worker}.jsonl", "a", encoding="utf-8")  # noqa: SIM115  # open for the whole run
    config.add_cleanup(out.close)

    def record(observation: Any) -> None:
        if getattr(observation, "type", None) != "test_case":
            return
        line = {
            "property": observation.property,
            "status": observation.status,
            # The arguments as Hypothesis makes them JSON (dataclasses as dicts, ...);
            # not its printed representation, which prints a composite's result
            # differently by how the strategy drew it.
            "arguments": observation.arguments,
        }
        out.write(_ADDRESS.sub(" at 0x", json.dumps(line, default=repr, sort_keys=True)) + "\n")

    add_observability_callback(record)
