"""plugins/module_utils/gpu_nvml.py: the NVML reader, replaying what the real H200's NVML answered.

tests/unit/fixtures/real-h200/nvml-calls.json holds every pynvml call the
reader made on the lent H200 (driver 580.159.04, nvidia-ml-py 13.610.43) with
its answer; a RECORDED pynvml (a replay, not NVIDIA's library) gives those
answers back, so the reader's logic runs on real data without a GPU.
"""

from __future__ import annotations

import json
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from llmfleet.module_utils import gpu_nvml, gpu_smi
from llmfleet.paths import REPO_ROOT

REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200"
RECORD = json.loads((REAL / "nvml-calls.json").read_text())


class NVMLError(Exception):
    pass


def _object(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{key: _object(item) for key, item in value.items()})
    if isinstance(value, list):
        return [_object(item) for item in value]
    return value


def recorded_pynvml(calls: list[dict[str, Any]]) -> ModuleType:
    """A pynvml that answers each call as the real one did, in the order it was asked."""
    module = ModuleType("recorded_pynvml")
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    for name, value in RECORD["constants"].items():
        setattr(module, name, value)
    pending = list(calls)

    def answer(name: str) -> Any:
        def call(*args: Any) -> Any:
            recorded = pending.pop(0)
            assert recorded["name"] == name, f"the reader asked {name} where the H200 run asked {recorded['name']}"
            if "error" in recorded:
                raise NVMLError(recorded["error"])
            return _object(recorded["result"])

        return call

    for name in {call["name"] for call in calls}:
        setattr(module, name, answer(name))
    module.pending = pending  # type: ignore[attr-defined]
    return module


def test_the_reader_gives_what_it_gave_on_the_h200() -> None:
    nvml = recorded_pynvml(RECORD["calls"])
    facts = gpu_nvml.read_nvml(nvml)
    assert nvml.pending == []  # type: ignore[attr-defined]
    assert facts == RECORD["result"]
    assert (facts["source"], facts["driver_version"], facts["cuda_driver_version"]) == ("nvml", "580.159.04", "13.0")
    [gpu] = facts["gpus"]
    assert (gpu["name"], gpu["compute_capability"], gpu["memory_total_mib"]) == ("NVIDIA H200", "9.0", 143771)
    assert (gpu["mig_mode"], gpu["persistence_mode"], gpu["power_limit_w"]) == ("Disabled", "Enabled", 700.0)
    assert gpu["ecc"] == {"current": "Enabled", "pending": "Enabled", "uncorrected_volatile": 0}


def test_nvml_and_nvidia_smi_agree_on_the_h200() -> None:
    """The two readers, on the same GPU minutes apart: the same facts, bar what moves."""
    nvml = RECORD["result"]["gpus"][0]
    smi = gpu_smi.parse_smi_xml((REAL / "nvidia-smi-q-x.xml").read_text())["gpus"][0]
    moving = {"memory_used_mib", "memory_free_mib", "power_draw_w", "temperature_c", "compute_capability", "clocks"}
    assert {k: v for k, v in nvml.items() if k not in moving} == {k: v for k, v in smi.items() if k not in moving}
    assert nvml["clocks"]["sm_max_mhz"] == smi["clocks"]["sm_max_mhz"] == 1980
    # NVML's v1 memory query counts the driver's reservation as used (615 MiB
    # here); nvidia-smi lists it apart (<reserved>616 MiB</reserved>, used 0).
    assert abs((nvml["memory_used_mib"] + nvml["memory_free_mib"]) - nvml["memory_total_mib"]) <= 1
    assert abs(nvml["memory_free_mib"] - smi["memory_free_mib"]) <= 1


def test_a_query_the_gpu_does_not_support_is_none_not_a_failure() -> None:
    calls = [dict(call) for call in RECORD["calls"]]
    for call in calls:
        if call["name"] in ("nvmlDeviceGetMigMode", "nvmlDeviceGetEccMode"):
            call.pop("result")
            call["error"] = "Not Supported"
    facts = gpu_nvml.read_nvml(recorded_pynvml(calls))
    assert facts["gpus"][0]["mig_mode"] is None
    assert facts["gpus"][0]["ecc"]["current"] is None
    assert facts["gpus"][0]["memory_total_mib"] == 143771


def test_no_driver_is_a_clear_refusal() -> None:
    calls = [{"name": "nvmlInit", "args": [], "error": "Driver Not Loaded"}]
    with pytest.raises(gpu_nvml.NvmlUnavailable, match=r"NVML could not start .*Driver Not Loaded"):
        gpu_nvml.read_nvml(recorded_pynvml(calls))


def test_no_pynvml_is_a_clear_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ModuleType:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(gpu_nvml.importlib, "import_module", missing)
    with pytest.raises(gpu_nvml.NvmlUnavailable, match="nvidia-ml-py"):
        gpu_nvml.read_nvml()
