"""Unit tests for plugins/filter/packages.py's apt-cache madison and preferences-glob filters.

The dpkg ordering and runc filters are tested in tests/unit/roles/test_docker_pins.py, beside the pins
they judge. The madison lines here have the shapes apt-cache prints: the first two fields right-aligned
to ten characters, one line per version and source, deb-src lines under the source package's name.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

_REPO = Path(__file__).parents[4]
_SPEC = importlib.util.spec_from_file_location("llmfleet_filter_packages", _REPO / "plugins" / "filter" / "packages.py")
assert _SPEC and _SPEC.loader
packages = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(packages)

# Debian 12 with bookworm-security and deb-src enabled: one package from two repositories.
DOCKER_IO = """\
 docker.io | 20.10.24+dfsg1-1+deb12u1+b6 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
 docker.io | 20.10.24+dfsg1-1+b3 | http://deb.debian.org/debian bookworm/main amd64 Packages
 docker.io | 20.10.24+dfsg1-1+deb12u1 | http://deb.debian.org/debian-security bookworm-security/main Sources
 docker.io | 20.10.24+dfsg1-1 | http://deb.debian.org/debian bookworm/main Sources
"""
# Docker CE's repository: every version carries the epoch 5.
DOCKER_CE = """\
 docker-ce | 5:27.3.1-1~debian.12~bookworm | https://download.docker.com/linux/debian bookworm/stable amd64 Packages
 docker-ce | 5:27.3.0-1~debian.12~bookworm | https://download.docker.com/linux/debian bookworm/stable amd64 Packages
"""
# Two packages in one call, from NVIDIA's flat repository and Debian's non-free; the source line names
# nvidia-graphics-drivers, not the package asked for.
DRIVER = """\
nvidia-driver | 535.261.03-1 | https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
nvidia-driver | 535.216.01-1~deb12u1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
nvidia-graphics-drivers | 535.216.01-1~deb12u1 | http://deb.debian.org/debian bookworm/non-free Sources
libnvidia-ml1 | 535.261.03-1 | https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            DOCKER_IO,
            {
                "docker.io": [
                    "20.10.24+dfsg1-1+deb12u1+b6",
                    "20.10.24+dfsg1-1+b3",
                    "20.10.24+dfsg1-1+deb12u1",
                    "20.10.24+dfsg1-1",
                ]
            },
        ),
        (DOCKER_CE, {"docker-ce": ["5:27.3.1-1~debian.12~bookworm", "5:27.3.0-1~debian.12~bookworm"]}),
        (
            DRIVER,
            {
                "nvidia-driver": ["535.261.03-1", "535.216.01-1~deb12u1"],
                "nvidia-graphics-drivers": ["535.216.01-1~deb12u1"],
                "libnvidia-ml1": ["535.261.03-1"],
            },
        ),
        # Nothing offered: apt-cache prints nothing on stdout (its notice goes to stderr).
        ("", {}),
        # Padding of any width, tabs, a carriage return, and no spaces at all.
        (
            "      runc |    1.1.12-0ubuntu3 | http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages\r\n"
            "runc|1.1.12-0ubuntu2|http://archive.ubuntu.com/ubuntu noble/main amd64 Packages\n"
            "\truntime-x\t|\t2.0-1\t|\tfile:/srv/standins  Packages",
            {"runc": ["1.1.12-0ubuntu3", "1.1.12-0ubuntu2"], "runtime-x": ["2.0-1"]},
        ),
        # Lines without a '|' are no records: apt's notices, when stderr is merged in.
        ("N: Unable to locate package cuda-toolkit-12-9\nW: Some index files failed to download\n", {}),
    ],
    ids=["several-repositories", "epoch", "several-packages", "empty", "odd-spacing", "no-records"],
)
def test_madison_output_is_read_per_package_in_its_order(output: str, expected: dict[str, list[str]]) -> None:
    assert packages.apt_madison(output) == expected
    # The roles pass stdout_lines.
    assert packages.apt_madison(output.splitlines()) == expected
    assert list(packages.apt_madison(output)) == list(expected)


@pytest.mark.parametrize("bad", [None, 5, {"docker.io": "1.0"}, ["docker.io | 1.0 | x", 3]])
def test_what_is_not_madison_output_is_refused(bad: object) -> None:
    with pytest.raises(AnsibleFilterError, match="apt-cache madison's stdout"):
        packages.apt_madison(bad)


@pytest.mark.parametrize("line", ["docker.io |", " | 1.0 | http://example.org stable Packages", "|"])
def test_a_record_without_package_or_version_is_refused(line: str) -> None:
    with pytest.raises(AnsibleFilterError, match=re.escape(repr(line))):
        packages.apt_madison([line])


@pytest.mark.parametrize(
    ("output", "version", "expected"),
    [
        # The newest offered at the glob, which madison lists first.
        (DRIVER, "535.261.03-*", {"nvidia-driver": "535.261.03-1", "libnvidia-ml1": "535.261.03-1"}),
        (
            DRIVER,
            "535.216.01-*",
            {"nvidia-driver": "535.216.01-1~deb12u1", "nvidia-graphics-drivers": "535.216.01-1~deb12u1"},
        ),
        (DOCKER_IO, "20.10.24+dfsg1-1+b3", {"docker.io": "20.10.24+dfsg1-1+b3"}),
        (DOCKER_IO, "20.10.24+dfsg1-1*", {"docker.io": "20.10.24+dfsg1-1+deb12u1+b6"}),
        (DOCKER_CE, "5:27.3.0-*", {"docker-ce": "5:27.3.0-1~debian.12~bookworm"}),
        # The whole version must match: the epoch is part of it, and nothing is a prefix.
        (DOCKER_CE, "27.3.1-*", {}),
        (DRIVER, "535.261.0-*", {}),
        (DRIVER, "35.261.03-*", {}),
        # '.' and '+' are literal, not regular expression.
        (DRIVER, "535x261x03-*", {}),
        (DOCKER_IO, "20.10.24+dfsg1-1+b", {}),
        ("", "535.261.03-*", {}),
    ],
)
def test_the_offered_version_is_the_first_matching_the_glob(
    output: str, version: str, expected: dict[str, str]
) -> None:
    assert packages.apt_offered_at(packages.apt_madison(output), version) == expected


def test_an_unquoted_numeric_pin_is_read_as_written() -> None:
    assert packages.apt_offered_at({"cuda-nvcc": ["12.4", "12.40"]}, 12.4) == {"cuda-nvcc": "12.4"}


@pytest.mark.parametrize(("offered", "version"), [(["x | 1 | y"], "1*"), ({}, None), ({}, True), ({}, ["1*"])])
def test_bad_input_to_offered_at_is_refused(offered: object, version: object) -> None:
    with pytest.raises(AnsibleFilterError, match="apt_offered_at expects"):
        packages.apt_offered_at(offered, version)


def test_the_filters_are_registered() -> None:
    filters = packages.FilterModule().filters()
    assert filters["apt_madison"] is packages.apt_madison
    assert filters["apt_offered_at"] is packages.apt_offered_at
    assert filters["apt_names_matching"] is packages.apt_names_matching


def test_no_task_file_parses_madison_by_hand() -> None:
    # Issue 33: one parser. A task file that runs apt-cache madison reads it through apt_madison.
    readers = {}
    for path in sorted((_REPO / "roles").glob("*/tasks/*.yml")):
        text = path.read_text()
        if "'madison'" in text or " madison," in text:
            readers[path.relative_to(_REPO).as_posix()] = "apt_madison" in text and "split('|')" not in text
    assert len(readers) >= 6, readers
    assert all(readers.values()), readers


def _driver_set_globs() -> list[str]:
    variables = yaml.safe_load((_REPO / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())
    return variables["__nvidia_driver_set_globs"]


# Names of the driver's set as Debian 12, Ubuntu and NVIDIA's repository spell them, and neighbours that are not.
@pytest.mark.parametrize(
    ("name", "in_set"),
    [
        ("nvidia-driver", True),
        ("nvidia-kernel-dkms", True),
        ("libnvidia-ml1", True),
        ("libcuda1", True),
        ("libnvcuvid1", True),
        ("libnvoptix1", True),
        ("libnvidia-compute-535", True),
        ("nvidia-fabricmanager-535", True),
        ("xserver-xorg-video-nvidia", True),
        ("libcudart12", False),
        ("cuda-toolkit-12-1", False),
        ("libcuda-dev", False),
        ("nouveau-firmware", False),
        ("curl", False),
    ],
)
def test_the_driver_sets_globs_pin_its_packages_and_nothing_else(name: str, in_set: bool) -> None:
    assert packages.apt_names_matching([name], _driver_set_globs()) == ([name] if in_set else [])


def test_no_pin_file_uses_a_regular_expression() -> None:
    # apt compiles a /regular expression/ pin anew for every package name each time it loads its cache: on
    # Debian's 63,000 names that added about 1 s to every apt command on a GPU host (issue 28). Globs instead.
    records = {}
    for path in sorted((_REPO / "roles").glob("*/templates/*preferences*.j2")):
        records[path.relative_to(_REPO).as_posix()] = re.findall(r"^Package:\s*/.*$", path.read_text(), re.MULTILINE)
    assert len(records) >= 4, records
    assert {path: found for path, found in records.items() if found} == {}


def test_names_matching_refuses_one_string_for_a_list() -> None:
    # A bare string would be read glob by glob, one character each: '*nvidia*' would match every name.
    with pytest.raises(AnsibleFilterError, match="a list of globs"):
        packages.apt_names_matching(["curl"], "*nvidia*")
