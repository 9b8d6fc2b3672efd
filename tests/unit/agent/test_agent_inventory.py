"""Inventory detection: NVML absent, a fake NVML, several card classes, and the overrides."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agent.inventory import InventoryError, detect, gpu_class_of, parse_gpus_override


class NVMLError(Exception):
    pass


def fake_nvml(names: list[str], *, init_error: str | None = None) -> Any:
    """The slice of pynvml the agent calls, answering with ``names``."""
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error:
            raise NVMLError(init_error)

    return SimpleNamespace(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(names),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        # Older bindings answer bytes, newer ones str.
        nvmlDeviceGetName=lambda h: names[h].encode() if h % 2 else names[h],
    )


def test_without_nvml_the_node_has_no_cards_and_says_why() -> None:
    inv = detect(nvml=None)
    assert (inv.gpu_class, inv.gpus, inv.source) == (None, 0, "none")
    assert inv.notes == ("the NVML bindings (nvidia-ml-py) are not installed",)
    assert inv.memory_gb is not None and inv.memory_gb > 0
    assert inv.cpus >= 1


def test_a_driver_that_does_not_load_means_no_cards() -> None:
    inv = detect(nvml=fake_nvml([], init_error="Driver Not Loaded"))
    assert inv.gpus == 0
    assert inv.notes == ("NVML did not initialise: Driver Not Loaded",)


def test_the_installed_bindings_see_no_cards_on_a_machine_without_a_driver() -> None:
    # The real pynvml: on a machine with cards this reports them instead.
    inv = detect()
    assert inv.source in {"none", "nvml"}
    assert (inv.gpus > 0) == (inv.source == "nvml")


def test_cards_found_by_nvml_are_reported_by_class_with_their_indices() -> None:
    nvml = fake_nvml(["NVIDIA A100-SXM4-80GB"] * 4)
    inv = detect(nvml=nvml)
    assert (inv.gpu_class, inv.devices, inv.source) == ("A100", (0, 1, 2, 3), "nvml")
    assert nvml.calls == ["init", "shutdown"]


def test_a_node_with_several_card_classes_reports_the_one_it_has_most_of() -> None:
    inv = detect(nvml=fake_nvml(["Tesla T4", "NVIDIA A100-PCIE-40GB", "Tesla T4"]))
    assert (inv.gpu_class, inv.devices) == ("T4", (0, 2))
    assert "several classes (A100, T4); reporting the 2 T4 cards only" in inv.notes[0]


def test_the_gpus_override_wins_over_detection() -> None:
    inv = detect(nvml=fake_nvml(["Tesla T4"] * 4), gpus="T4:2")
    assert (inv.gpu_class, inv.devices, inv.source) == ("T4", (0, 1), "override")
    assert detect(nvml=None, gpus="SIM:3").devices == (0, 1, 2)
    assert detect(nvml=fake_nvml(["Tesla T4"]), gpus="none").gpus == 0


def test_the_memory_override_wins_over_detection() -> None:
    assert detect(nvml=None, memory_gb=512).memory_gb == 512
    with pytest.raises(InventoryError, match="--memory-gb -1"):
        detect(nvml=None, memory_gb=-1)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "RTXA6000"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA", "UNKNOWN"),
    ],
)
def test_a_card_name_reduces_to_its_class(name: str, cls: str) -> None:
    assert gpu_class_of(name) == cls


@pytest.mark.parametrize("bad", ["A100", "A100:", ":8", "A100:x", "A100:0", "A 100:8", "A100:2000"])
def test_a_malformed_gpus_override_is_refused_with_the_form_to_write(bad: str) -> None:
    with pytest.raises(InventoryError, match=r"is not CLASS:COUNT.*--gpus A100:8"):
        parse_gpus_override(bad)
