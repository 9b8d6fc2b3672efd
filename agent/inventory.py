"""What the node has: host memory and CPUs (psutil), cards through NVML when a driver is there.

Detection never guesses: without a driver (no NVML library, or it does not
initialise) the node has no cards, and an operator who knows better says so
with ``--gpus CLASS:COUNT``. The control plane schedules by GPU *class*, so a
card's marketing name (``NVIDIA A100-SXM4-80GB``) is reduced to one
(``A100``); a name the rule reduces badly is corrected by the same override.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

# Vendor and line words that say nothing about which card it is.
_NOISE = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
_CLASS = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Inventory:
    """The node as reported. ``devices`` are the card indices engines may be given."""

    gpu_class: str | None
    devices: tuple[int, ...]
    memory_gb: float | None
    cpus: int
    # Where the cards came from: "nvml", "override" or "none"; for the start-up log.
    source: str = "none"
    notes: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return len(self.devices)


class InventoryError(ValueError):
    """An override the agent cannot use; the message says what to write instead."""


def gpu_class_of(device_name: str) -> str:
    """The class a card's name stands for: its model, without vendor words or variants.

    >>> gpu_class_of("NVIDIA A100-SXM4-80GB"), gpu_class_of("Tesla T4")
    ('A100', 'T4')
    >>> gpu_class_of("NVIDIA GeForce RTX 4090"), gpu_class_of("NVIDIA H100 80GB HBM3")
    ('RTX4090', 'H100')
    """
    words = [w for w in device_name.split() if w.upper() not in _NOISE]
    if not words:
        return "UNKNOWN"
    first = words[0].split("-")[0]
    # "RTX 4090", "RTX A6000": a series word alone names no card; take its number.
    if first.isalpha() and len(words) > 1:
        first += words[1].split("-")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "", first) or "UNKNOWN"


def parse_gpus_override(value: str) -> tuple[str | None, int]:
    """``CLASS:COUNT`` (or ``none``) from ``--gpus``.

    >>> parse_gpus_override("A100:8"), parse_gpus_override("none")
    (('A100', 8), (None, 0))
    """
    if value.strip().lower() in {"none", "0"}:
        return None, 0
    cls, sep, count = value.partition(":")
    if not sep or not _CLASS.match(cls) or not count.isdigit() or not 1 <= int(count) <= 1024:
        raise InventoryError(
            f"--gpus {value!r} is not CLASS:COUNT; write the card class and how many, "
            "such as --gpus A100:8, or --gpus none for a node without cards"
        )
    return cls, int(count)


def load_nvml() -> ModuleType | None:
    """The NVML bindings (``nvidia-ml-py``), or None when they are not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def nvml_cards(nvml: Any) -> tuple[list[tuple[int, str]], str | None]:
    """(index, name) of each card NVML sees, and why there are none when it sees none.

    Any failure (no library, no driver, no permission) means no cards: a node
    is not refused for lacking a driver; it simply serves CPU profiles.
    """
    if nvml is None:
        return [], "the NVML bindings (nvidia-ml-py) are not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return [], f"NVML did not initialise: {exc}"
    try:
        cards = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
            cards.append((index, name.decode() if isinstance(name, bytes) else str(name)))
        return cards, None if cards else "NVML sees no cards"
    except Exception as exc:
        return [], f"NVML failed while listing cards: {exc}"
    finally:
        # Nothing depends on a clean shutdown of a read-only session.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def detect(
    *, gpus: str | None = None, memory_gb: float | None = None, nvml: Any = "load"
) -> Inventory:
    """The node's inventory: detected, then corrected by the operator's overrides.

    ``nvml`` is the NVML module to ask (tests pass a fake); by default the
    installed bindings. A node whose cards are of several classes reports the
    class it has most of (the control plane's node has one class) and only
    those cards' indices are given to engines.
    """
    notes: list[str] = []
    module = load_nvml() if nvml == "load" else nvml
    cards, why_none = nvml_cards(module)
    detected_class: str | None = None
    devices: tuple[int, ...] = ()
    source = "none"
    if cards:
        counts = Counter(gpu_class_of(name) for _, name in cards)
        detected_class = max(sorted(counts), key=lambda c: counts[c])
        devices = tuple(i for i, name in cards if gpu_class_of(name) == detected_class)
        source = "nvml"
        if len(counts) > 1:
            notes.append(
                f"cards of several classes ({', '.join(sorted(counts))}); reporting the "
                f"{len(devices)} {detected_class} cards only"
            )
    elif why_none:
        notes.append(why_none)
    gpu_class = detected_class
    if gpus is not None:
        gpu_class, count = parse_gpus_override(gpus)
        # The override names how many cards engines may use: the first COUNT
        # detected ones, or 0..COUNT-1 where nothing was detected (a card the
        # driver cannot see, or a test cluster with pretend cards).
        devices = devices[:count] if len(devices) >= count else tuple(range(count))
        source = "override"
    if memory_gb is not None and not 0 < memory_gb <= 1 << 30:
        raise InventoryError(f"--memory-gb {memory_gb} is not a positive number of GB")
    memory = memory_gb if memory_gb is not None else _host_memory_gb()
    return Inventory(
        gpu_class=gpu_class,
        devices=devices,
        memory_gb=memory,
        cpus=psutil.cpu_count() or 1,
        source=source,
        notes=tuple(notes),
    )


def _host_memory_gb() -> float:
    # GB of 2**30 bytes, rounded down to a tenth: what a profile's min_memory_gb is read against.
    return int(psutil.virtual_memory().total / (1 << 30) * 10) / 10
