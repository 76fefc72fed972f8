"""plugins/module_utils/gpu_smi.py: `nvidia-smi -q -x` parsed, on the real H200's report and the lab's stand-in.

The real report (tests/unit/fixtures/real-h200/nvidia-smi-q-x.xml) was printed
by driver 580.159.04 on the lent H200; the stand-in nvidia-smi
(files/standins/, NOT NVIDIA's) must go through the same parser.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.lab import standins
from llmfleet.module_utils import gpu_smi
from llmfleet.paths import REPO_ROOT

REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200"
XML = (REAL / "nvidia-smi-q-x.xml").read_text()


def test_the_real_h200_report() -> None:
    facts = gpu_smi.parse_smi_xml(XML)
    versions = (facts["source"], facts["driver_version"], facts["cuda_driver_version"])
    assert versions == ("nvidia-smi", "580.159.04", "13.0")
    [gpu] = facts["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["uuid"] == "GPU-217ee39e-ed23-4138-ecce-08c8168c2179"
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"], gpu["memory_free_mib"]) == (143771, 0, 143156)
    assert (gpu["mig_mode"], gpu["persistence_mode"], gpu["display_active"]) == ("Disabled", "Enabled", "Disabled")
    assert gpu["clocks"]["sm_max_mhz"] == 1980
    assert gpu["clocks"]["memory_max_mhz"] == 3201
    assert gpu["power_limit_w"] == 700.0
    assert gpu["ecc"] == {"current": "Enabled", "pending": "Enabled", "uncorrected_volatile": 0}
    assert isinstance(gpu["temperature_c"], int)
    assert facts["processes"] == []
    # Driver 580's report carries no compute capability: the query interface gives it.
    assert gpu["compute_capability"] is None


def test_compute_capability_comes_from_the_query_interface() -> None:
    facts = gpu_smi.parse_smi_xml(XML)
    # The line the real nvidia-smi prints for --query-gpu=pci.bus_id,compute_cap --format=csv,noheader.
    caps = gpu_smi.parse_compute_caps("00000000:00:06.0, 9.0\n")
    assert gpu_smi.add_compute_caps(facts, caps)["gpus"][0]["compute_capability"] == "9.0"


def test_processes_holding_memory_are_listed_with_their_gpu() -> None:
    # The real report with one process added, in the layout nvidia-smi uses for it.
    process = (
        "<processes><process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A"
        "</compute_instance_id><pid>4242</pid><type>C</type><process_name>python3</process_name>"
        "<used_memory>70210 MiB</used_memory></process_info></processes>"
    )
    altered = XML.replace("<processes>\n\t\t</processes>", process)
    assert altered != XML
    facts = gpu_smi.parse_smi_xml(altered)
    assert facts["processes"] == [
        {"gpu_index": 0, "gpu_uuid": "GPU-217ee39e-ed23-4138-ecce-08c8168c2179", "pid": 4242, "name": "python3",
         "type": "C", "used_memory_mib": 70210}
    ]


def test_an_older_drivers_power_readings_are_found() -> None:
    # Before the 530s the limit lived in power_readings/power_limit.
    old = XML.replace("<gpu_power_readings>", "<power_readings>").replace("</gpu_power_readings>", "</power_readings>")
    old = old.replace("current_power_limit", "power_limit")
    assert gpu_smi.parse_smi_xml(old)["gpus"][0]["power_limit_w"] == 700.0


@pytest.mark.parametrize(
    "text", ["", "No devices were found", "<html></html>", "<nvidia_smi_log>"], ids=["empty", "words", "other", "cut"]
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(gpu_smi.SmiParseError):
        gpu_smi.parse_smi_xml(text)


def _stand_in(tmp_path: Path) -> Path:
    standin = next(s for s in standins.load_standins() if s.name == "nvidia-smi" and s.version == "535.261.03-1")
    script = tmp_path / "nvidia-smi"
    script.write_text(standins.render_file(standin, (standins.STANDINS_DIR / "nvidia-smi").read_text()))
    script.chmod(0o755)
    return script


def test_the_stand_in_goes_through_the_same_parser(tmp_path: Path) -> None:
    smi = _stand_in(tmp_path)
    report = subprocess.run([sys.executable, smi, "-q", "-x"], capture_output=True, text=True, check=True)
    assert "STAND-IN" in report.stdout and "STAND-IN" in report.stderr
    facts = gpu_smi.parse_smi_xml(report.stdout)
    assert facts["driver_version"] == "535.261.03"
    assert [gpu["name"] for gpu in facts["gpus"]] == ["NVIDIA GeForce RTX 4090 (llmfleet STAND-IN)"] * 2
    assert [(g["memory_total_mib"], g["memory_used_mib"], g["memory_free_mib"]) for g in facts["gpus"]] == [
        (24564, 1748, 22462), (24564, 3, 24207)
    ]
    assert facts["gpus"][0]["display_active"] == "Enabled"
    # Like the real report, no compute capability; the stand-in's query interface has it.
    caps = subprocess.run([sys.executable, smi, *gpu_smi.SMI_COMPUTE_CAP_ARGV[1:]], capture_output=True, text=True,
                          check=True).stdout
    filled = gpu_smi.add_compute_caps(facts, gpu_smi.parse_compute_caps(caps))
    assert [gpu["compute_capability"] for gpu in filled["gpus"]] == ["8.9", "8.9"]


def test_the_stand_in_report_has_the_real_reports_layout(tmp_path: Path) -> None:
    """Every element the stand-in prints sits where the real H200 report has it."""
    import xml.etree.ElementTree as ET

    def paths(node: ET.Element, prefix: str = "") -> set[str]:
        here = f"{prefix}/{node.tag}"
        return {here}.union(*(paths(child, here) for child in node))

    smi = _stand_in(tmp_path)
    printed = subprocess.run([sys.executable, smi, "-q", "-x"], capture_output=True, text=True, check=True).stdout
    # The stand-in's own output and the committed report: nothing untrusted.
    stand_in = ET.fromstring(printed)  # noqa: S314
    assert paths(stand_in) - paths(ET.fromstring(XML)) == set()  # noqa: S314
