"""What an operator notices on a host after the common role ran.

The expected limits and the lab's time sync settings are the ones
converge.yml sets; everything else is the role's defaults.
"""

from __future__ import annotations

import re

import pytest

BASELINE_PACKAGES = ["ca-certificates", "curl", "gnupg", "htop", "jq", "lsof", "rsync"]
# converge.yml: name -> (home, supplementary groups, GECOS)
SERVICE_USERS = {
    "llmtestsvc": ("/srv/llmtestsvc", {"llmtest"}, "llmfleet test service"),
    "llmtestplain": ("/var/lib/llmtestplain", set(), "llmfleet llmtestplain"),
}
# What older versions created by default: no llmfleet container runs as them.
OLD_DEFAULT_ACCOUNTS = ["vllm", "llmgateway", "llmworker"]
# converge.yml
JOURNALD_LIMITS = {"SystemMaxUse": "256M", "SystemKeepFree": "512M", "MaxRetentionSec": "2weeks"}
DROPIN = "/etc/systemd/journald.conf.d/50-llmfleet.conf"


@pytest.mark.parametrize("package", [*BASELINE_PACKAGES, "chrony", "unattended-upgrades"])
def test_package_is_installed(host, package):
    assert host.package(package).is_installed


def test_baseline_tools_run(host):
    assert host.run_test("jq --version").rc == 0
    assert host.run_test("curl --version").rc == 0


def test_chrony_is_the_only_time_sync_daemon(host):
    chrony = host.service("chrony")
    assert chrony.is_running
    assert chrony.is_enabled
    assert not host.package("systemd-timesyncd").is_installed


def test_chronyd_answers_and_leaves_the_clock_alone(host):
    # chronyc talks to the running daemon; it fails when chronyd is down.
    tracking = host.run_test("chronyc -n tracking")
    assert tracking.rc == 0, tracking.stderr
    assert "Reference ID" in tracking.stdout
    # The lab runs chronyd with -x and no sources (converge.yml).
    assert "-x" in host.check_output("ps -o args= -C chronyd").split()
    assert host.check_output("chronyc -n sources | tail -n +3").strip() == ""
    assert "pool " not in host.file("/etc/chrony/chrony.conf").content_string


@pytest.mark.parametrize(("name", "home", "groups", "comment"), [(name, *spec) for name, spec in SERVICE_USERS.items()])
def test_service_user(host, name, home, groups, comment):
    user = host.user(name)
    assert user.exists
    assert user.shell == "/usr/sbin/nologin"
    assert user.home == home
    assert user.uid < 1000, "service users are system users"
    assert user.group == name
    assert set(user.groups) - {name} == groups
    assert user.gecos == comment
    directory = host.file(home)
    assert directory.is_directory
    assert directory.user == name
    assert directory.group == name
    assert directory.mode == 0o750
    # create_home: false, so no skeleton dotfiles.
    assert host.run(f"ls -A {home}").stdout.strip() == ""


@pytest.mark.parametrize("name", OLD_DEFAULT_ACCOUNTS)
def test_no_account_is_created_by_default(host, name):
    assert not host.user(name).exists
    assert not host.file(f"/var/lib/{name}").exists


def test_no_group_is_created_by_default(host):
    assert not host.group("llmfleet").exists


@pytest.mark.parametrize("name", SERVICE_USERS)
def test_service_user_cannot_log_in(host, name):
    result = host.run(f"su {name} -c true")
    assert result.rc != 0
    assert "not available" in result.stdout + result.stderr


def test_journald_is_running(host):
    assert host.service("systemd-journald").is_running


def test_journald_dropin_sets_the_limits(host):
    dropin = host.file(DROPIN)
    assert dropin.user == "root"
    assert dropin.mode == 0o644
    content = dropin.content_string
    assert "[Journal]" in content
    for key, value in JOURNALD_LIMITS.items():
        assert f"\n{key}={value}\n" in content
    # systemd reads the drop-in as part of journald.conf ...
    merged = host.check_output("systemd-analyze cat-config systemd/journald.conf")
    assert DROPIN in merged
    assert "SystemMaxUse=256M" in merged


def test_journald_applies_the_limit(host):
    # ... and the running journald reports the limit: its latest start logs
    # "System Journal (...) is 8.0M, max 256.0M, 248.0M free."
    reports = host.check_output("journalctl -u systemd-journald -o cat --no-pager | grep 'System Journal'")
    assert "max 256.0M" in reports.splitlines()[-1]


def _apt_config_list(host, key):
    """The values of an apt list option, as apt itself resolves them."""
    dump = host.check_output(f"apt-config dump {key}")
    return re.findall(rf'^{re.escape(key)}:: "(.*)";$', dump, flags=re.MULTILINE)


def test_unattended_upgrades_blacklist_is_in_effect(host):
    blacklist = _apt_config_list(host, "Unattended-Upgrade::Package-Blacklist")
    for entry in ("nvidia-", "libnvidia-", "cuda($|-)", "libcudnn", "libnccl", "docker-", r"docker\.io$", "containerd"):
        assert entry in blacklist
    # unattended-upgrade itself reads the same list.
    debug = host.run("unattended-upgrade --dry-run --debug")
    assert debug.rc == 0, debug.stderr
    initial = next(line for line in (debug.stdout + debug.stderr).splitlines() if line.startswith("Initial blacklist:"))
    assert "nvidia-" in initial.split()
    assert r"docker\.io$" in initial.split()


@pytest.mark.parametrize(
    ("package", "held"),
    [
        ("nvidia-driver", True),
        ("nvidia-container-toolkit", True),
        ("libnvidia-compute", True),
        ("cuda", True),
        ("cuda-toolkit-12-1", True),
        ("libcudnn8", True),
        ("libnccl2", True),
        ("docker-ce", True),
        ("docker.io", True),
        ("containerd.io", True),
        ("curl", False),
        ("cudatext", False),
        ("dockerfile-mode", False),
        ("libc6", False),
    ],
)
def test_unattended_upgrades_blacklist_matches_pinned_packages(host, package, held):
    # unattended-upgrade matches each entry with Python's re.match.
    blacklist = _apt_config_list(host, "Unattended-Upgrade::Package-Blacklist")
    assert any(re.match(entry, package) for entry in blacklist) is held


def test_automatic_upgrades_are_on(host):
    dump = host.check_output("apt-config dump APT::Periodic")
    assert 'APT::Periodic::Update-Package-Lists "1";' in dump
    assert 'APT::Periodic::Unattended-Upgrade "1";' in dump
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in host.check_output(
        "apt-config dump Unattended-Upgrade::Automatic-Reboot"
    )
