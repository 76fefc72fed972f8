"""roles/preflight/filter_plugins/preflight_checks.py: the preflight role's checks and their messages.

Each check was a task of Jinja in the role's evaluate.yml; now each is a function of plain
data, called here directly (no ansible-playbook). For every branch of every check: the
status (PASS, WARN or FAIL), whether it applies at all, and the words that tell the
operator what was found and what to do. The whole list for the real H200's readings is
compared word for word with what the role said there (tests/unit/fixtures/real-h200-faults/).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from llmfleet.paths import REPO_ROOT
from tests.tools import load_plugin

ROLE = REPO_ROOT / "roles" / "preflight"
PLUGIN = ROLE / "filter_plugins" / "preflight_checks.py"
FAULTS = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-faults"
# The faults were recorded before the nvswitch check was written; the same H200's own
# recording of that check is in real-h200-pci/.
NVSWITCH = json.loads((REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci" / "checks.json").read_text())[
    "preflight_nvswitch_check"
]
SUPPORTED_OS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__preflight_supported_os"]
MARKER = "/var/lib/llmfleet/nvidia-driver-reboot-required"
MOK = "/var/lib/dkms/mok.pub"


checks = load_plugin(PLUGIN, "preflight_checks_under_test")


def _pci(count: int) -> list[dict[str, str]]:
    return [{"slot": f"0000:{0x18 + i:02x}:00.0", "device": "0x2330", "class": "0x030200", "driver": "nvidia"}
            for i in range(count)]


def _gpu(index: int, free: int) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H100", "memory_total_mib": 81559, "memory_used_mib": 81559 - free,
            "memory_free_mib": free, "memory_engine_mib": 0, "display_active": "N/A"}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _h200_inputs(**changes: Any) -> dict[str, Any]:
    """The inputs evaluate.yml gathered on the real H200 while holder.py held 4706 MiB
    (preflight-holder.json), with changes."""
    inputs = {
        "distribution": "Ubuntu", "distribution_version": "24.04", "distribution_major_version": "24",
        "supported_os": SUPPORTED_OS, "min_gpus": 1, "lab_no_gpu": False,
        "pci_gpus": [{"slot": "0000:00:06.0", "device": "0x2335", "class": "0x030200", "driver": "nvidia"}],
        "pci_nvswitches": [], "smi_state": "ok", "driver_version": "580.159.04", "cuda_driver_version": "13.0",
        "gpu_source": "nvml", "gpu_probe_msg": "",
        "gpus": [{**_gpu(0, 138441), "name": "NVIDIA H200", "memory_total_mib": 143771}],
        "reboot_pending": False, "reboot_marker": MARKER, "fabric_manager": "",
        "gpu_memory_gaps": [], "gap_pct": 5, "gap_fatal": True,
        "gpu_processes": [{"gpu_index": 0, "pid": 509, "name": "/opt/torch/.venv/bin/python3", "container_id": None,
                           "used_memory_mib": 4706, "engine": False}],
        "stray_fatal": True,
        "disk": [{"mount": "/", "available_gib": 63.9, "needed_gib": 5, "short": False,
                  "uses": ["model weights in /var/lib/llmfleet/models 5 GiB"]}],
        "dev_shm": {"mount": "/dev/shm", "available_kib": 134217728, "size_kib": 134217728},
        "shm_min_mib": 1024, "shm_limits": ["18446744073692774399", "18446744073692774399", "4096"],
        "page_size": "4096", "proc_modules": _b64("nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n"),
        "nvidia_module_loaded": True, "secure_boot_state": "no-efi", "dkms_key": "absent", "dkms_mok": MOK,
        "secure_boot_fatal": True,
    }
    return {**inputs, **changes}


# --- The whole list ----------------------------------------------------------


def test_the_filter_map_names_the_filter() -> None:
    assert set(checks.FilterModule().filters()) == {"preflight_checks"}


def _as_recorded(name: str) -> list[dict[str, str]]:
    """What the role said on the real H200, with its nvswitch check where the role puts it."""
    recorded: list[dict[str, str]] = json.loads((FAULTS / f"preflight-{name}.json").read_text())["results"]
    at = [result["check"] for result in recorded].index("gpus-visible") + 1
    return [*recorded[:at], *NVSWITCH, *recorded[at:]]


def test_the_real_h200_gets_what_the_role_said_there_word_for_word() -> None:
    assert checks.preflight_checks(_h200_inputs()) == _as_recorded("holder")


def test_the_real_h200_with_a_64_mib_dev_shm_gets_what_the_role_said_there() -> None:
    dev_shm = {"mount": "/dev/shm", "available_kib": 65536, "size_kib": 65536}
    gpus = [{**_gpu(0, 143155), "name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert checks.preflight_checks(_h200_inputs(dev_shm=dev_shm, gpu_processes=[], gpus=gpus)) == _as_recorded("shm")


def test_checks_that_do_not_apply_are_left_out_and_the_order_kept() -> None:
    results = checks.preflight_checks(_h200_inputs(smi_state="absent", gpus=[], gpu_processes=[]))
    assert [result["check"] for result in results] == [
        "os", "gpus", "nvidia-smi", "nvswitch", "disk", "dev-shm", "kernel-shm", "nouveau", "secure-boot"]


def test_evaluate_yml_gathers_exactly_the_inputs_the_filter_takes() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "evaluate.yml").read_text())
    [task] = [task for task in tasks if "preflight_checks" in str(task.get("ansible.builtin.set_fact", ""))]
    assert list(task["vars"]["__preflight_check_inputs"]) == list(checks.INPUTS)
    assert "preflight_nvswitch_count" in task["ansible.builtin.set_fact"]


@pytest.mark.parametrize(("change", "message"), [
    ({"bogus": 1}, "unknown bogus"),
    ({"shm_limits": ["1", "2"]}, "expected shmmax, shmall and shmmni"),
    ({"pci_gpus": "0000:00:06.0"}, "pci_gpus: expected a list, got str"),
    ({"pci_gpus": [{"device": "0x2335"}]}, "has no slot"),
    ({"lab_no_gpu": "maybe"}, "lab_no_gpu: expected true or false, got 'maybe'"),
    ({"min_gpus": "two"}, "min_gpus: expected a whole number, got 'two'"),
    ({"shm_min_mib": 1.5}, "shm_min_mib: expected a whole number, got 1.5"),
    ({"smi_state": None}, "smi_state: expected a string, got NoneType"),
    ({"gpu_processes": [{"pid": 1, "container_id": None}]}, "has no gpu_index"),
    ({"proc_modules": "not base64!"}, "proc_modules is not base64"),
    ({"secure_boot_state": "enabled", "dkms_key": "lost"}, "dkms_key 'lost' is none of enrolled"),
    ({"dev_shm": {"mount": "/dev/shm", "size_kib": "big"}}, "size_kib is not a number"),
    ({"supported_os": ["Ubuntu"]}, "supported_os: expected a mapping"),
    ({"gpu_memory_gaps": [{"index": 0}]}, "an item of gpu_memory_gaps has no 'name'"),
    ({"gpu_processes": [{"gpu_index": 0, "pid": 1, "container_id": 7}]}, "container_id is not a string: 7"),
    ({"disk": [{"mount": "/"}]}, "an item of disk has no 'available_gib'"),
], ids=["unknown-input", "short-shm-limits", "not-a-list", "no-slot", "not-a-flag", "not-a-number",
        "not-whole", "no-state", "no-gpu-index", "not-base64", "unknown-dkms-key", "size-not-a-number",
        "os-not-a-mapping", "gap-without-name", "container-id-not-a-string", "filesystem-without-space"])
def test_malformed_inputs_are_refused_with_what_is_wrong(change: dict[str, Any], message: str) -> None:
    with pytest.raises(AnsibleFilterError, match="preflight_checks: .*" + message.replace("(", r"\(")):
        checks.preflight_checks(_h200_inputs(**change))


def test_a_missing_input_is_named() -> None:
    inputs = _h200_inputs()
    del inputs["dkms_mok"]
    with pytest.raises(AnsibleFilterError, match="lack dkms_mok and have unknown nothing"):
        checks.preflight_checks(inputs)


def test_flags_and_numbers_given_as_strings_are_read_as_ansible_reads_them() -> None:
    result = checks.check_gpu_processes("ok", _h200_inputs()["gpu_processes"], "false")
    assert result["status"] == "WARN"
    assert checks.check_gpus(_pci(2), "2", "no")["status"] == "PASS"
    assert checks.check_gpus([], 1, "yes")["status"] == "WARN"
    assert checks.check_gpus([], 1, 0)["status"] == "FAIL"


# --- os ------------------------------------------------------------------------


@pytest.mark.parametrize(("facts", "status"), [
    (("Debian", "12.5", "12"), "PASS"),
    (("Ubuntu", "22.04", "22"), "PASS"),
    (("Ubuntu", "20.04", "20"), "FAIL"),
    (("Rocky", "9.3", "9"), "FAIL"),
], ids=["major-version", "full-version", "old-version", "other-distribution"])
def test_the_os_is_one_llmfleet_supports(facts: tuple[str, str, str], status: str) -> None:
    result = checks.check_os(*facts, SUPPORTED_OS)
    assert result["status"] == status
    if status == "PASS":
        assert result["detail"] == f"{facts[0]} {facts[1]} is supported"
    else:
        assert result["detail"] == (f"{facts[0]} {facts[1]} is not supported; llmfleet supports Debian 12, "
                                    "Ubuntu 22.04/24.04. Reinstall the host with one of them.")


# --- gpus ----------------------------------------------------------------------


def test_enough_gpus_pass_with_their_slots() -> None:
    result = checks.check_gpus(_pci(2), 1, False)
    assert result == {"check": "gpus", "status": "PASS",
                      "detail": "2 NVIDIA GPU(s) on the PCI bus (0000:18:00.0, 0000:19:00.0; at least 1 needed)"}


def test_too_few_gpus_fail_with_what_to_check() -> None:
    result = checks.check_gpus(_pci(2), 4, False)
    assert result["status"] == "FAIL"
    assert result["detail"].startswith("2 NVIDIA GPU(s) on the PCI bus, 4 needed. Check that the GPUs are seated")
    assert "lower preflight_min_gpus; a lab host without a GPU needs preflight_allow_no_gpu: true" in result["detail"]


def test_a_lab_host_without_gpu_only_warns_and_says_it_cannot_serve() -> None:
    result = checks.check_gpus([], 1, True)
    assert result["status"] == "WARN"
    assert result["detail"].startswith("NO NVIDIA GPU on the PCI bus. This host passes only because")
    assert result["detail"].endswith("it cannot serve a model on a GPU")


# --- nvidia-smi ----------------------------------------------------------------


def _smi(state: str, gpus: int = 2, message: str = "", reboot: bool = False, lab: bool = False) -> dict[str, str]:
    result: dict[str, str] = checks.check_nvidia_smi(
        state, [_gpu(i, 80000) for i in range(gpus)], "580.95.05", "13.0", "nvml", message, reboot, MARKER, lab)
    return result


def test_a_driver_that_lists_gpus_passes() -> None:
    assert _smi("ok")["detail"] == "driver 580.95.05 (CUDA 13.0), 2 GPU(s), read through nvml"
    assert _smi("ok")["status"] == "PASS"


def test_no_driver_yet_warns() -> None:
    result = _smi("absent", gpus=0, message="no nvidia-smi")
    assert result == {"check": "nvidia-smi", "status": "WARN",
                      "detail": "not installed yet (the nvidia_driver role installs it): GPU memory was not checked"}


@pytest.mark.parametrize("state", ["failing", "ok"])
def test_a_failing_driver_waiting_for_a_reboot_warns_and_says_reboot(state: str) -> None:
    result = _smi(state, gpus=0, message="NVIDIA-SMI has failed", reboot=True)
    assert result["status"] == "WARN"
    assert result["detail"] == (f"fails, and the nvidia_driver role is waiting for a reboot ({MARKER}): reboot the "
                                "host, then rerun. NVIDIA-SMI has failed")


@pytest.mark.parametrize(("gpus", "lab", "status"), [(0, False, "FAIL"), (0, True, "WARN")], ids=["serving", "lab"])
def test_a_failing_driver_fails_with_what_to_check(gpus: int, lab: bool, status: str) -> None:
    result = _smi("failing", gpus=gpus, message="NVIDIA-SMI has failed", lab=lab)
    assert result["status"] == status
    assert result["detail"].startswith("fails or lists no GPU: the driver is installed but not working. "
                                       "NVIDIA-SMI has failed. Check `dkms status`")
    assert result["detail"].endswith("then rerun the nvidia_driver role")


def test_a_driver_that_answers_but_lists_no_gpu_fails() -> None:
    assert _smi("ok", gpus=0)["status"] == "FAIL"
    assert _smi("ok", gpus=0)["detail"].startswith("fails or lists no GPU: the driver is installed but not working. . ")


def test_a_long_message_is_cut_at_a_word_as_jinja_truncate_did() -> None:
    assert "abc abc..." in _smi("failing", message="abc " * 102)["detail"]
    whole = ("word " * 81)[:405]
    assert f"working. {whole}. Check" in _smi("failing", message=whole)["detail"]


# --- gpus-visible ----------------------------------------------------------------


def test_the_driver_seeing_every_gpu_passes() -> None:
    result = checks.check_gpus_visible("ok", _pci(2), [_gpu(0, 1), _gpu(1, 1)])
    assert result == {"check": "gpus-visible", "status": "PASS",
                      "detail": "nvidia-smi lists all 2 GPU(s) of the PCI bus"}


def test_a_gpu_the_driver_does_not_see_fails_with_the_drivers_bound() -> None:
    bus = [*_pci(2), {"slot": "0000:1a:00.0", "device": "0x2330", "class": "0x030200", "driver": "vfio-pci"}]
    result = checks.check_gpus_visible("ok", bus, [_gpu(0, 1), _gpu(1, 1)])
    assert result["status"] == "FAIL"
    assert result["detail"].startswith("3 GPU(s) on the PCI bus, nvidia-smi lists 2. Kernel drivers bound: "
                                       "0000:18:00.0=nvidia, 0000:19:00.0=nvidia, 0000:1a:00.0=vfio-pci. ")
    assert "fallen off the bus (dmesg | grep -i xid)" in result["detail"]


@pytest.mark.parametrize(("state", "bus"), [("absent", 2), ("failing", 2), ("ok", 0)])
def test_without_a_driver_answer_or_a_gpu_on_the_bus_visibility_is_not_checked(state: str, bus: int) -> None:
    assert checks.check_gpus_visible(state, _pci(bus), []) is None


# --- nvswitch (more in test_preflight_nvswitch.py, through ansible-playbook) ---------


SWITCHES = [{"slot": f"0000:0{5 + i}:00.0", "device": "0x22a3", "class": "0x068000", "driver": "nvidia-nvswitch"}
            for i in range(2)]


def test_no_nvswitch_needs_no_fabric_manager() -> None:
    assert checks.check_nvswitch([], "", "ok", False, MARKER) == {
        "check": "nvswitch", "status": "PASS",
        "detail": "none on the PCI bus: this host needs no NVIDIA Fabric Manager",
    }


def test_nvswitches_with_fabric_manager_active_pass() -> None:
    result = checks.check_nvswitch(SWITCHES, "active\n", "ok", False, MARKER)
    assert result["status"] == "PASS"
    assert result["detail"] == ("2 NVSwitch(es) (0000:05:00.0 device 0x22a3, 0000:06:00.0 device 0x22a3): "
                                "nvidia-fabricmanager is active, as CUDA needs on an NVSwitch system")


def test_nvswitches_before_the_driver_pass_with_what_comes() -> None:
    result = checks.check_nvswitch(SWITCHES, "inactive", "absent", False, MARKER)
    assert result["status"] == "PASS"
    assert result["detail"].endswith("the nvidia_driver role installs it with the driver "
                                     "(nvidia_driver_fabric_manager: auto)")


@pytest.mark.parametrize(("fabric_manager", "state", "reboot", "said"), [
    ("failed", "ok", False, "failed"),
    ("", "failing", False, "not installed"),
    (None, "ok", False, "not installed"),
    (" inactive\n", "absent", True, "inactive"),
], ids=["failed", "not-installed", "probe-skipped", "before-reboot"])
def test_nvswitches_without_fabric_manager_warn_with_what_to_do(
    fabric_manager: str | None, state: str, reboot: bool, said: str
) -> None:
    result = checks.check_nvswitch(SWITCHES, fabric_manager, state, reboot, MARKER)
    assert result["status"] == "WARN"
    assert f'nvidia-fabricmanager is {said}, so CUDA fails on every GPU (error 802, "system not' in result["detail"]
    waiting = (f"while nvidia-smi works. The nvidia_driver role is waiting for a reboot ({MARKER}): reboot, then "
               "rerun. Run")
    assert (waiting in result["detail"]) == reboot
    assert result["detail"].endswith("with `dpkg -l 'nvidia-fabricmanager*'`)")


# --- gpu-memory ----------------------------------------------------------------


GAP = {"index": 0, "name": "NVIDIA H100", "total": 81559, "used": 21559, "free": 60000, "display": "Enabled",
       "sibling": 1, "sibling_free": 80100, "gap": 20100, "gap_pct": 25.1}


def test_gpus_with_even_free_memory_pass_with_the_numbers() -> None:
    result = checks.check_gpu_memory([_gpu(0, 80000), _gpu(1, 80100)], [], 5, True)
    assert result == {"check": "gpu-memory", "status": "PASS", "detail": "free memory per GPU (MiB): GPU 0 80000, "
                      "GPU 1 80100; none more than 5% below its siblings"}


@pytest.mark.parametrize(("fatal", "status"), [(True, "FAIL"), (False, "WARN")])
def test_a_gpu_short_of_free_memory_is_named_with_what_to_do(fatal: bool, status: str) -> None:
    result = checks.check_gpu_memory([_gpu(0, 60000), _gpu(1, 80100)], [GAP, {**GAP, "index": 2}], 2.5, fatal)
    assert result["status"] == status
    one = ("has 60000 MiB free of 81559 MiB (21559 MiB used, display Enabled): 20100 MiB (25.1%) less than "
           "GPU 1's 80100 MiB. ")
    assert result["detail"].startswith(f"GPU 0 (NVIDIA H100) {one}GPU 2 (NVIDIA H100) {one}vLLM gives every GPU")
    assert "move the display to another GPU" in result["detail"]
    assert result["detail"].endswith("set preflight_gpu_free_memory_gap_fatal: false (or raise "
                                     "preflight_gpu_free_memory_gap_pct, 2.5 now)")


def test_without_a_gpu_listed_free_memory_is_not_compared() -> None:
    assert checks.check_gpu_memory([], [], 5, True) is None


# --- gpu-processes -------------------------------------------------------------


def _process(pid: int, engine: bool, **extra: Any) -> dict[str, Any]:
    return {"gpu_index": 0, "pid": pid, "name": "python3", "container_id": "e" * 64 if engine else None,
            "used_memory_mib": 700, "engine": engine, **extra}


def test_no_process_holding_gpu_memory_passes() -> None:
    assert checks.check_gpu_processes("ok", [], True)["detail"] == "no process holds GPU memory"


def test_the_engines_processes_pass_and_are_counted() -> None:
    result = checks.check_gpu_processes("ok", [_process(1, True), _process(2, True)], True)
    assert result == {"check": "gpu-processes", "status": "PASS",
                      "detail": "no process holds GPU memory but the 2 engine process(es) in the vllm role containers"}


@pytest.mark.parametrize(("fatal", "status"), [(True, "FAIL"), (False, "WARN")])
def test_a_stray_process_is_named_with_where_it_runs_and_what_to_do(fatal: bool, status: str) -> None:
    processes = [_process(1, True), _process(509, False),
                 _process(77, False, name="", container_id="c" * 64, used_memory_mib=0, gpu_index=1)]
    result = checks.check_gpu_processes("ok", processes, fatal)
    assert result["status"] == status
    assert result["detail"].startswith("GPU 0: pid 509 (python3, on the host) holds 700 MiB. "
                                       "GPU 1: pid 77 (?, container cccccccccccc) holds ? MiB. Only the vllm role's")
    assert result["detail"].endswith("Stop it (kill the pid, or docker rm -f the container), then rerun; to accept "
                                     "it, set preflight_gpu_stray_processes_fatal: false")


@pytest.mark.parametrize("state", ["absent", "failing"])
def test_without_a_driver_answer_processes_are_not_checked(state: str) -> None:
    assert checks.check_gpu_processes(state, [], True) is None


# --- disk ----------------------------------------------------------------------


def _fs(mount: str, available: float, needed: float, *uses: str) -> dict[str, Any]:
    return {"mount": mount, "available_gib": available, "needed_gib": needed, "uses": list(uses),
            "short": available < needed}


def test_enough_disk_passes_per_filesystem() -> None:
    result = checks.check_disk([_fs("/", 100.0, 50, "model weights in /srv 50 GiB"),
                                _fs("/var/lib/docker", 50.0, 40, "container images in /var/lib/docker 40 GiB")])
    assert result == {"check": "disk", "status": "PASS", "detail": "/: 100.0 GiB free, 50 GiB needed (model weights "
                      "in /srv 50 GiB); /var/lib/docker: 50.0 GiB free, 40 GiB needed (container images in "
                      "/var/lib/docker 40 GiB)"}


def test_a_short_filesystem_fails_with_its_uses_and_what_to_do() -> None:
    result = checks.check_disk([_fs("/", 100.0, 501.5, "model weights in /srv 500 GiB", "/x in /x 1.5 GiB"),
                                _fs("/data", 50.0, 40, "images in /data 40 GiB")])
    assert result["status"] == "FAIL"
    assert result["detail"] == ("/: 100.0 GiB free, 501.5 GiB needed (model weights in /srv 500 GiB + /x in /x "
                                "1.5 GiB): TOO LITTLE; /data: 50.0 GiB free, 40 GiB needed (images in /data 40 GiB) "
                                "-- free space there, mount a larger disk at the path, or change "
                                "preflight_disk_requirements (and the roles' paths) to a filesystem with room")


def test_no_disk_requirements_pass_and_say_so() -> None:
    assert checks.check_disk([])["detail"] == "no disk requirements (preflight_disk_requirements is empty)"


# --- dev-shm -------------------------------------------------------------------


@pytest.mark.parametrize(("dev_shm", "found"), [
    ({"mount": "/dev/shm", "available_kib": 65536, "size_kib": 65536}, "/dev/shm is 64 MiB"),
    ({"mount": "/", "available_kib": 65536, "size_kib": 209715200}, "/dev/shm is not a mounted tmpfs"),
    (None, "/dev/shm is not a mounted tmpfs"),
], ids=["small", "a-directory-of-root", "not-measured"])
def test_a_small_or_missing_dev_shm_fails_with_what_nccl_needs(dev_shm: dict[str, Any] | None, found: str) -> None:
    result = checks.check_dev_shm(dev_shm, 1024)
    assert result["status"] == "FAIL"
    assert result["detail"].startswith(f"{found}, 1024 MiB needed. NCCL keeps its buffers there")
    assert result["detail"].endswith("run it with --shm-size or --ipc=host")


def test_a_large_enough_dev_shm_passes() -> None:
    result = checks.check_dev_shm({"mount": "/dev/shm", "available_kib": 0, "size_kib": 1048576}, 1024)
    assert result == {"check": "dev-shm", "status": "PASS", "detail": "/dev/shm is 1024 MiB, 1024 MiB needed"}


# --- kernel-shm ----------------------------------------------------------------


def test_kernel_limits_above_the_minimum_pass_with_the_values() -> None:
    result = checks.check_kernel_shm(["536870912", "131072", "32000"], "4096", 512)
    assert result == {"check": "kernel-shm", "status": "PASS", "detail": "kernel.shmmax 536870912 bytes, "
                      "kernel.shmall 131072 pages of 4096 bytes, kernel.shmmni 32000"}


@pytest.mark.parametrize("limits", [["33554432", "2097152", "4096"], ["18446744073692774399", "1000", "4096"]],
                         ids=["shmmax", "shmall"])
def test_a_kernel_limit_below_the_minimum_fails_with_what_to_do(limits: list[str]) -> None:
    result = checks.check_kernel_shm(limits, "4096", 1024)
    assert result["status"] == "FAIL"
    assert result["detail"].endswith(": below the 1024 MiB one shared memory segment may need. Raise them (the "
                                     "kernel_tuning role computes them from memory) or lower preflight_shm_min_mib")


def test_kernel_limits_are_read_as_jinjas_int_read_them() -> None:
    # Whatever is not a number counts as 0; shmall is quoted as the kernel printed it.
    result = checks.check_kernel_shm(["x", "2.5e3", " 7 "], "4096", 1024)
    assert result["status"] == "FAIL"
    assert result["detail"].startswith("kernel.shmmax 0 bytes, kernel.shmall 2.5e3 pages of 4096 bytes, "
                                       "kernel.shmmni 7: below the 1024 MiB")


# --- nouveau -------------------------------------------------------------------


NOUVEAU = _b64("video 1 1 nouveau, Live 0\nnouveau 2 0 - Live 0x0\n")


@pytest.mark.parametrize(("modules", "detail"), [
    (None, "not loaded (this kernel has no /proc/modules: no loadable modules)"),
    (_b64("nvidia 1 0 - Live 0\nnouveau_x 1 0 - Live 0\nvideo 1 1 nouveau, Live 0\n"), "not loaded"),
], ids=["no-proc-modules", "not-loaded"])
def test_nouveau_not_loaded_passes(modules: str | None, detail: str) -> None:
    assert checks.check_nouveau(modules, "ok", True, False) == {"check": "nouveau", "status": "PASS", "detail": detail}


@pytest.mark.parametrize(("state", "module"), [("ok", False), ("failing", False), ("absent", True)])
def test_nouveau_loaded_beside_the_nvidia_driver_fails_with_the_fix(state: str, module: bool) -> None:
    result = checks.check_nouveau(NOUVEAU, state, module, False)
    assert result["status"] == "FAIL"
    assert result["detail"].startswith("LOADED although the NVIDIA driver is installed: it holds the GPUs")
    assert "rebuild the initramfs (update-initramfs -u) and reboot" in result["detail"]


@pytest.mark.parametrize(("state", "reboot"), [("absent", False), ("ok", True)], ids=["no-driver", "before-reboot"])
def test_nouveau_loaded_before_the_driver_or_its_reboot_warns(state: str, reboot: bool) -> None:
    assert checks.check_nouveau(NOUVEAU, state, False, reboot) == {
        "check": "nouveau", "status": "WARN",
        "detail": "loaded: the nvidia_driver role blacklists it; it stays loaded until the host reboots"}


# --- secure-boot ---------------------------------------------------------------


@pytest.mark.parametrize(("state", "key", "detail"), [
    ("no-efi", "absent", "no EFI firmware (legacy BIOS boot, or a container): the kernel does not enforce module "
                         "signatures"),
    ("disabled", "not-enrolled", "disabled: unsigned modules load"),
    ("enabled", "enrolled", f"enabled; DKMS's signing key {MOK} is enrolled, so the nvidia module it builds loads"),
], ids=["no-efi", "disabled", "enrolled"])
def test_secure_boot_that_lets_the_module_load_passes(state: str, key: str, detail: str) -> None:
    assert checks.check_secure_boot(state, key, MOK, True) == {"check": "secure-boot", "status": "PASS",
                                                                "detail": detail}


@pytest.mark.parametrize(("key", "fatal", "status", "said"), [
    ("not-enrolled", True, "FAIL", "not enrolled"),
    ("not-enrolled", False, "WARN", "not enrolled"),
    ("absent", True, "WARN", "not made yet (DKMS makes it when it first builds the nvidia module)"),
    ("unknown", True, "WARN", "of unknown state (no mokutil)"),
])
def test_secure_boot_on_without_an_enrolled_key_says_how_to_enrol_it(key: str, fatal: bool, status: str,
                                                                      said: str) -> None:
    result = checks.check_secure_boot("enabled", key, MOK, fatal)
    assert result["status"] == status
    assert result["detail"] == (f"ENABLED: the kernel loads only signed modules, and DKMS's signing key {MOK} is "
                                f"{said}. Enrol it (mokutil --import {MOK}, reboot, confirm at the console's MOK "
                                "manager), or turn Secure Boot off in the firmware; otherwise the nvidia module is "
                                "refused at load")


def test_an_unknown_secure_boot_state_warns_with_how_to_check() -> None:
    assert checks.check_secure_boot("unknown", "absent", MOK, True) == {
        "check": "secure-boot", "status": "WARN",
        "detail": "unknown (no mokutil and no readable SecureBoot EFI variable): check it with mokutil --sb-state"}
