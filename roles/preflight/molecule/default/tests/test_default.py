"""What an operator reads on a host after the preflight role ran.

The host is a GPU-less container (preflight_allow_no_gpu) with a stand-in
nvidia-smi (llmfleet STAND-IN, prepare.yml) that reports two RTX 4090s, GPU 0
with a display and 1745 MiB less free memory; the last converge play lets that
pass as a warning.
"""

from __future__ import annotations

import json

REPORT = "/var/lib/llmfleet/preflight.txt"
FACTS = "/etc/ansible/facts.d/gpus.fact"


def report(host) -> str:
    """The report with its line wrapping undone (runs of whitespace become one space)."""
    return " ".join(host.file(REPORT).content_string.split())


def test_report_is_written(host):
    file = host.file(REPORT)
    assert file.exists
    assert file.mode == 0o644
    assert file.content_string.startswith("#\n# Ansible managed")


def test_report_says_loudly_that_the_host_has_no_gpu(host):
    text = report(host)
    assert "LAB HOST WITHOUT GPU" in text
    assert "preflight_allow_no_gpu" in text
    assert "[WARN] gpus NO NVIDIA GPU on the PCI bus" in text


def test_report_names_the_gpu_with_less_free_memory(host):
    text = report(host)
    assert "[WARN] gpu-memory" in text
    assert "GPU 0 (NVIDIA GeForce RTX 4090 (llmfleet STAND-IN)) has 22462 MiB" in text
    assert "1745 MiB (7.2%) less than GPU 1's 24207 MiB" in text
    assert "display Enabled" in text


def test_report_lists_both_gpus_with_their_memory(host):
    text = report(host)
    assert "GPU 0 NVIDIA GeForce RTX 4090 (llmfleet STAND-IN) 00000000:01:00.0 total 24564 used 1748 free 22462" in text
    assert "GPU 1 NVIDIA GeForce RTX 4090 (llmfleet STAND-IN) 00000000:02:00.0 total 24564 used 3 free 24207" in text


def test_report_verdict_and_the_other_checks(host):
    text = report(host)
    assert "Verdict: PASS, 2 warning(s)" in text
    for check in ("os", "nvidia-smi", "disk", "dev-shm", "kernel-shm", "nouveau", "secure-boot"):
        assert f"[PASS] {check}" in text, check
    # Models and images share the root filesystem: 1 + 1 GiB on it.
    assert "2 GiB needed (model weights in /var/lib/llmfleet/models 1 GiB + container images in" in text
    assert "/dev/shm is 64 MiB, 32 MiB needed" in text


def test_gpu_facts_are_stable_json(host):
    file = host.file(FACTS)
    assert file.exists
    assert file.mode == 0o644
    facts = json.loads(file.content_string)
    assert facts["count"] == 2
    assert facts["driver_version"] == "535.261.03"
    assert facts["lab_no_gpu"] is True
    assert facts["pci"] == []
    assert [gpu["index"] for gpu in facts["gpus"]] == [0, 1]
    assert facts["gpus"][0]["memory_total_mib"] == 24564
    assert facts["gpus"][0]["compute_capability"] == "8.9"
    # Free memory changes from run to run: it stays out of the facts.
    assert all("memory_free_mib" not in gpu for gpu in facts["gpus"])


def test_preflight_installed_nothing(host):
    # The role only reads: no driver, no nouveau blacklist.
    assert not host.package("nvidia-driver").is_installed
    assert not host.file("/etc/modprobe.d/llmfleet-blacklist-nouveau.conf").exists
