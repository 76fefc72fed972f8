"""What an operator notices on a host after the kernel_tuning role ran.

The test host is a container: prepare.yml made its own System V shared-memory
sysctls writable (they belong to the container's IPC namespace); every other
key stays read-only, as Docker mounts /proc/sys. So the role must apply and
read back the first kind, and persist-but-not-apply the second, marking them.
converge.yml sets the huge pages, the extras and the limits users.
"""

from __future__ import annotations

import re

import pytest

SYSCTL_FILE = "/etc/sysctl.d/60-llmfleet.conf"
LIMITS_FILE = "/etc/security/limits.d/60-llmfleet.conf"
MANAGER_DROPIN = "/etc/systemd/system.conf.d/60-llmfleet-limits.conf"
SHM_RAM_FRACTION = 0.5  # the default
NOFILE = (65536, 1048576)  # the defaults: soft, hard
APPLIED = ["kernel.shmall", "kernel.shmmax", "kernel.shmmni"]
NOT_APPLIED = ["fs.nr_open", "net.core.somaxconn", "vm.nr_hugepages", "vm.swappiness"]
LIMITS_USERS = ["llmtest", "@llmtest"]  # converge.yml


@pytest.fixture(scope="module")
def wanted(host) -> dict[str, str]:
    """The sysctls the role must have set: the formula from defaults/main.yml, the defaults, converge.yml."""
    meminfo = host.file("/proc/meminfo").content_string
    mem_bytes = int(re.search(r"^MemTotal:\s+(\d+) kB$", meminfo, re.MULTILINE).group(1)) * 1024
    page_size = int(host.check_output("getconf PAGESIZE"))
    shmmax = int(mem_bytes * SHM_RAM_FRACTION)
    return {
        "kernel.shmmax": str(shmmax),
        "kernel.shmall": str(shmmax // page_size),
        "kernel.shmmni": "8192",
        "vm.swappiness": "5",
        "net.core.somaxconn": "4096",
        "fs.nr_open": "1048576",
        "vm.nr_hugepages": "4",
    }


@pytest.fixture(scope="module")
def persisted(host) -> dict[str, str]:
    content = host.file(SYSCTL_FILE).content_string
    return dict(re.findall(r"^([a-z0-9_.]+) = (.*)$", content, re.MULTILINE))


def test_shm_limits_follow_the_memory(wanted):
    # Sanity of the formula itself: half the RAM, in pages of 4 KiB on x86_64.
    assert int(wanted["kernel.shmall"]) * 4096 <= int(wanted["kernel.shmmax"])
    assert 0 < int(wanted["kernel.shmmax"]) < 2**62


def test_the_file_persists_every_sysctl(host, wanted, persisted):
    sysctl_file = host.file(SYSCTL_FILE)
    assert sysctl_file.user == "root"
    assert sysctl_file.mode == 0o644
    assert persisted == wanted
    assert "Ansible managed" in sysctl_file.content_string


@pytest.mark.parametrize("key", APPLIED)
def test_what_can_be_applied_is_applied(host, wanted, key):
    assert host.check_output(f"sysctl -n {key}") == wanted[key]


@pytest.mark.parametrize("key", NOT_APPLIED)
def test_what_cannot_be_applied_is_marked_in_the_file(host, key):
    lines = host.file(SYSCTL_FILE).content_string.splitlines()
    line = next(index for index, text in enumerate(lines) if text.startswith(f"{key} = "))
    assert lines[line - 1].startswith("# Not applied on this host while it is a container")


def test_applied_keys_are_not_marked(host):
    lines = host.file(SYSCTL_FILE).content_string.splitlines()
    for key in APPLIED:
        line = next(index for index, text in enumerate(lines) if text.startswith(f"{key} = "))
        assert not lines[line - 1].startswith("# Not applied")


def test_the_read_only_keys_really_are_read_only(host):
    # What the role relies on to decide: vm.* stays read-only in the test host.
    assert host.run("test -w /proc/sys/vm/swappiness").rc != 0
    assert host.run("test -w /proc/sys/kernel/shmmax").rc == 0


def test_nothing_read_later_at_boot_overrides_the_file(host, wanted):
    # systemd-sysctl applies the files in this order; the last assignment wins.
    boot = host.check_output("systemd-analyze cat-config sysctl.d")
    assert f"# {SYSCTL_FILE}" in boot
    for key, value in wanted.items():
        assignments = re.findall(rf"^\s*-?{re.escape(key)}\s*=\s*(.*?)\s*$", boot, re.MULTILINE)
        assert assignments[-1] == value, key


def test_limits_for_the_service_users(host):
    limits = host.file(LIMITS_FILE)
    assert limits.mode == 0o644
    entries = {tuple(line.split()) for line in limits.content_string.splitlines() if not line.startswith("#")}
    for user in LIMITS_USERS:
        assert (user, "soft", "nofile", str(NOFILE[0])) in entries
        assert (user, "hard", "nofile", str(NOFILE[1])) in entries
        assert (user, "soft", "memlock", "unlimited") in entries
        assert (user, "hard", "memlock", "unlimited") in entries


def test_the_systemd_manager_runs_with_the_limits(host):
    assert MANAGER_DROPIN in host.check_output("systemd-analyze cat-config systemd/system.conf")
    shown = dict(
        line.split("=", 1)
        for line in host.check_output(
            "systemctl show -p DefaultLimitNOFILESoft -p DefaultLimitNOFILE "
            "-p DefaultLimitMEMLOCKSoft -p DefaultLimitMEMLOCK"
        ).splitlines()
    )
    assert shown == {
        "DefaultLimitNOFILESoft": str(NOFILE[0]),
        "DefaultLimitNOFILE": str(NOFILE[1]),
        "DefaultLimitMEMLOCKSoft": "infinity",
        "DefaultLimitMEMLOCK": "infinity",
    }


def _hard_limit_of_pid1(host, name: str) -> int:
    line = next(text for text in host.file("/proc/1/limits").content_string.splitlines() if text.startswith(name))
    hard = line[len(name) :].split()[1]
    return 2**64 - 1 if hard == "unlimited" else int(hard)


def test_a_new_service_starts_with_the_limits(host):
    # A container without CAP_SYS_RESOURCE cannot raise a limit above its
    # own; systemd then gives the closest it can. On a machine that is the
    # limit itself.
    nofile_cap = _hard_limit_of_pid1(host, "Max open files")
    memlock_cap = _hard_limit_of_pid1(host, "Max locked memory")
    out = host.check_output("systemd-run --quiet --wait --pipe -- sh -c 'ulimit -Sn; ulimit -Hn; ulimit -Hl'")
    soft, hard, memlock = out.split()
    assert int(soft) == min(NOFILE[0], nofile_cap)
    assert int(hard) == min(NOFILE[1], nofile_cap)
    expected_memlock = "unlimited" if memlock_cap == 2**64 - 1 else str(memlock_cap // 1024)
    assert memlock == expected_memlock
