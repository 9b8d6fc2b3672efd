"""The declared catalog file is read without ever blocking, and only when it is a regular file.

Issue 36: a FIFO put in ``catalog.yaml``'s place froze `llmgw serve`'s reload thread for
good (opening a FIFO waits for a writer). Real files of each kind on a real file system;
each read runs in a thread with a bound, so a read that blocks fails instead of hanging.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from catalog import CatalogError, load_declared
from catalog.reading.documents import FILE_LIMITS, DocumentRefused, read_regular

BOUND = 30.0
GOOD = "models:\n  - name: m\n    source: org/m\n    profiles: [{name: p, gpu_class: T4}]\n"


def _bounded(call: Callable[[], Any]) -> Any:
    """``call()``'s result or exception, failing if it does not return within BOUND."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(BOUND)
    if worker.is_alive():
        pytest.fail(f"still blocked after {BOUND:g}s")
    return outcome[0]


def _refusal(path: Path) -> str:
    outcome = _bounded(lambda: load_declared(path))
    assert isinstance(outcome, CatalogError), outcome
    return str(outcome)


def test_a_fifo_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    fifo = tmp_path / "catalog.yaml"
    os.mkfifo(fifo)
    message = _refusal(fifo)
    assert message.startswith(f"{fifo}: cannot read the declared catalog: it is a FIFO")
    assert "put the file itself at this path" in message


def test_a_character_device_that_never_ends_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "catalog.yaml"
    link.symlink_to("/dev/zero")  # links are followed (a ConfigMap is one): the target counts
    assert "it is a character device, not a regular file" in _refusal(link)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "catalog.yaml"
    directory.mkdir()
    assert "it is a directory, not a regular file" in _refusal(directory)


def test_an_oversize_file_is_read_no_further_than_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "catalog.yaml"
    with big.open("wb") as f:
        f.truncate(FILE_LIMITS.max_bytes + 1 + (64 << 20))  # sparse: 80 MiB, nothing written
    assert len(read_regular(big, "declared catalog", FILE_LIMITS.max_bytes)) == (
        FILE_LIMITS.max_bytes + 1
    )
    outcome = _bounded(lambda: load_declared(big))
    assert isinstance(outcome, DocumentRefused) and outcome.limit == "bytes", outcome


def test_a_regular_file_and_a_link_to_one_are_read(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text(GOOD)
    link = tmp_path / "catalog.yaml"
    link.symlink_to(real)
    assert read_regular(link, "declared catalog", 1 << 20) == GOOD.encode()
    assert load_declared(link).names() == ["m"]


def test_a_missing_file_names_the_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read the declared catalog: No such file"):
        read_regular(tmp_path / "gone.yaml", "declared catalog", 1 << 20)
