"""What an operator notices on a host after the docker role ran.

The test host runs a real engine (its /var/lib/docker is a volume: see
molecule.yml). prepare.yml wrote a daemon.json by hand before the role ran;
converge.yml sets distinct log, shm and runtime settings. There is no
registry: the tests build a tiny image inside the test host with `docker
import` of a few of its own binaries. Test containers have no network.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

# The test host is Debian 12: its default pins are vars/Debian-12.yml's.
RELEASE_PINS = yaml.safe_load((Path(__file__).parents[3] / "vars" / "Debian-12.yml").read_text())
PINNED = {package["name"]: package["version"] for package in RELEASE_PINS["__docker_packages"]}
DAEMON_JSON = "/etc/docker/daemon.json"
CHECKER = "/usr/local/libexec/llmfleet/docker-config-check"
IMAGE = "llmfleet-molecule/probe:1"
PROBE_BINARIES = ["/usr/bin/dash", "/usr/bin/df", "/usr/bin/readlink", "/usr/bin/sleep"]
# prepare.yml's hand-written keys, and converge.yml's settings.
HAND_LABEL = "llmfleet.test=hand-added"
LOG_CONFIG = {"Type": "json-file", "Config": {"compress": "true", "max-file": "4", "max-size": "20m"}}
DEFAULT_SHM_KIB = 96 * 1024


@pytest.fixture(scope="module")
def info(host) -> dict:
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


@pytest.fixture(scope="module")
def daemon_json(host) -> dict:
    return json.loads(host.file(DAEMON_JSON).content_string)


@pytest.fixture(scope="module")
def image(host) -> str:
    """A few of the test host's binaries and their libraries, imported as an image."""
    binaries = " ".join(PROBE_BINARIES)
    script = f"""
        set -eu
        root=$(mktemp -d)
        for bin in {binaries}; do
            for file in "$bin" $(ldd "$bin" | grep -o '/[^ ]*'); do
                mkdir -p "$root$(dirname "$file")"
                cp -L "$file" "$root$file"
            done
        done
        ln -s dash "$root/usr/bin/sh"
        ln -s usr/bin "$root/bin"
        tar -C "$root" -c . | docker import - {IMAGE}
        rm -rf "$root"
    """
    host.check_output(f"bash -c {shlex.quote(script)}")
    return IMAGE


def _run(host, image: str, *options: str, command: str) -> str:
    return host.check_output(f"docker run --rm --network none {' '.join(options)} {image} {command}")


def _inspect(host, container: str, template: str) -> str:
    return host.check_output(f"docker inspect --format '{template}' {container}")


def _shm_kib(df_output: str) -> int:
    return int(df_output.splitlines()[-1].split()[1])


@pytest.mark.parametrize(("name", "version"), PINNED.items())
def test_package_is_pinned_and_held(host, name, version):
    installed, want = host.check_output(f"dpkg-query -W -f='${{Version}} ${{db:Status-Want}}' {name}").split()
    assert installed == version
    assert want == "hold"
    assert host.check_output(f"dpkg --get-selections {name}").split() == [name, "hold"]


def test_engine_runs_and_starts_at_boot(host):
    docker = host.service("docker")
    assert docker.is_running
    assert docker.is_enabled


def test_daemon_json_keeps_what_was_there_and_adds_the_role_settings(daemon_json):
    # Written by hand before the role ran (prepare.yml): still there.
    assert daemon_json["labels"] == [HAND_LABEL]
    assert daemon_json["max-concurrent-downloads"] == 2
    assert daemon_json["log-opts"]["compress"] == "true"
    # The role's settings, merged into the same maps.
    assert daemon_json["log-driver"] == "json-file"
    assert daemon_json["log-opts"] == {"compress": "true", "max-size": "20m", "max-file": "4"}
    assert daemon_json["default-shm-size"] == "96M"
    assert daemon_json["live-restore"] is True
    assert daemon_json["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime"}}
    assert "default-runtime" not in daemon_json
    # docker_daemon_config, merged last.
    assert daemon_json["max-concurrent-uploads"] == 3


def test_daemon_json_is_root_owned(host):
    daemon_json = host.file(DAEMON_JSON)
    assert (daemon_json.user, daemon_json.group, daemon_json.mode) == ("root", "root", 0o644)


def test_the_engine_accepted_the_merged_file(info):
    assert info["LoggingDriver"] == "json-file"
    assert info["LiveRestoreEnabled"] is True
    assert HAND_LABEL in info["Labels"]
    assert "nvidia" in info["Runtimes"]
    assert info["DefaultRuntime"] == "runc"
    # The volume under /var/lib/docker (molecule.yml) gives the real driver.
    assert info["Driver"] == "overlay2"


def test_a_container_gets_the_log_rotation(host, image):
    container = host.check_output(f"docker create --network none {image} dash -c true")
    try:
        log_config = json.loads(_inspect(host, container, "{{json .HostConfig.LogConfig}}"))
    finally:
        host.check_output(f"docker rm {container}")
    assert log_config == LOG_CONFIG


def test_a_container_gets_the_default_shm_size(host, image):
    assert _shm_kib(_run(host, image, command="df -k /dev/shm")) == DEFAULT_SHM_KIB


def test_a_container_starts_with_a_sized_shm(host, image):
    assert _shm_kib(_run(host, image, "--shm-size=256m", command="df -k /dev/shm")) == 256 * 1024


def test_a_container_starts_with_the_host_ipc(host, image):
    inside = _run(host, image, "--ipc=host", command="readlink /proc/self/ns/ipc")
    assert inside == host.check_output("readlink /proc/self/ns/ipc")
    # ... and the host's /dev/shm, not a container-sized one.
    shm = _run(host, image, "--ipc=host", command="df -k /dev/shm")
    assert _shm_kib(shm) == _shm_kib(host.check_output("df -k /dev/shm"))
    assert inside != _run(host, image, command="readlink /proc/self/ns/ipc")


def test_containers_keep_running_while_dockerd_restarts(host, image):
    container = host.check_output(f"docker run -d --network none {image} sleep 300")
    try:
        pid = _inspect(host, container, "{{.State.Pid}}")
        host.check_output("systemctl restart docker")
        assert _inspect(host, container, "{{.State.Running}} {{.State.Pid}}") == f"true {pid}"
    finally:
        host.check_output(f"docker rm -f {container}")


def test_docker_users_can_run_docker(host):
    assert "docker" in host.user("llmtest").groups
    version = host.run("runuser -u llmtest -- docker version --format '{{.Server.Version}}'")
    assert version.rc == 0, version.stderr
    assert version.stdout.strip().startswith("20.10.")


def test_the_config_check_accepts_the_file_and_refuses_a_bad_one(host):
    accepted = host.run(f"{CHECKER} {DAEMON_JSON}")
    assert accepted.rc == 0, accepted.stderr
    # Debian 12's 20.10 has no `dockerd --validate`: the check dry-loads.
    assert "dry load" in accepted.stdout
    assert host.run("dockerd --validate").rc != 0
    bad = json.dumps({"log-opts": {"max-size": "1m"}, "default-runtime": "nvidia"})
    host.check_output(f"echo '{bad}' > /root/bad-daemon.json")
    refused = host.run(f"{CHECKER} /root/bad-daemon.json")
    host.check_output("rm -f /root/bad-daemon.json")
    assert refused.rc == 1
    assert "specified default runtime 'nvidia' does not exist" in refused.stderr


def test_dockerd_gets_the_proxy_from_a_root_only_drop_in(host, info):
    dropin = host.file("/etc/systemd/system/docker.service.d/llmfleet-proxy.conf")
    assert (dropin.user, dropin.group, dropin.mode) == ("root", "root", 0o600)
    assert 'Environment="NO_PROXY=localhost,127.0.0.1"' in dropin.content_string
    assert info["HttpProxy"].endswith("@127.0.0.1:3128") and "s3cret" not in info["HttpProxy"]
    assert info["NoProxy"] == "localhost,127.0.0.1"
