"""Filters on Debian packages: dpkg's version ordering, what apt-cache madison offers, which names an apt
preferences glob matches, the docker role's runc check."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from ansible.errors import AnsibleFilterError

_VERSION = re.compile(r"^(?:(?P<epoch>\d+):)?(?P<upstream>[0-9][A-Za-z0-9.+~:-]*?)(?:-(?P<revision>[A-Za-z0-9.+~]+))?$")


def _split(version: str) -> tuple[int, str, str]:
    if not isinstance(version, str) or not (match := _VERSION.match(version.strip())):
        raise AnsibleFilterError(f"not a Debian package version: {version!r}")
    return int(match["epoch"] or 0), match["upstream"], match["revision"] or "0"


def _order(char: str) -> int:
    # dpkg: '~' sorts before everything, even the end of the string; letters before other characters.
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(left: str, right: str) -> int:
    """dpkg's verrevcmp: alternating non-digit and digit runs."""
    i = j = 0
    while i < len(left) or j < len(right):
        difference = 0
        while (i < len(left) and not left[i].isdigit()) or (j < len(right) and not right[j].isdigit()):
            a = _order(left[i]) if i < len(left) and not left[i].isdigit() else 0
            b = _order(right[j]) if j < len(right) and not right[j].isdigit() else 0
            if a != b:
                return -1 if a < b else 1
            i, j = i + 1, j + 1
        while i < len(left) and left[i] == "0":
            i += 1
        while j < len(right) and right[j] == "0":
            j += 1
        while i < len(left) and left[i].isdigit() and j < len(right) and right[j].isdigit():
            if not difference:
                difference = ord(left[i]) - ord(right[j])
            i, j = i + 1, j + 1
        if i < len(left) and left[i].isdigit():
            return 1
        if j < len(right) and right[j].isdigit():
            return -1
        if difference:
            return -1 if difference < 0 else 1
    return 0


def deb_version_compare(left: str, right: str) -> int:
    """-1, 0 or 1 as dpkg orders the two versions (`dpkg --compare-versions`)."""
    left_epoch, left_upstream, left_revision = _split(left)
    right_epoch, right_upstream, right_revision = _split(right)
    if left_epoch != right_epoch:
        return -1 if left_epoch < right_epoch else 1
    return _compare_part(left_upstream, right_upstream) or _compare_part(left_revision, right_revision)


def deb_upstream_version(version: str) -> str:
    """The upstream part of a package version: 1.1.5+ds1 of 1.1.5+ds1-1+deb12u1, 1.1.12 of 1.1.12-0ubuntu3."""
    return _split(version)[1]


def deb_version_max(versions: Sequence[str]) -> str:
    """The highest of versions as dpkg orders them ('' for none): a kernel's 6.1.0-101-amd64 above 6.1.0-26-amd64."""
    if not isinstance(versions, Sequence) or isinstance(versions, str):
        raise AnsibleFilterError(f"deb_version_max expects a list of versions, got {versions!r}")
    highest = ""
    for version in versions:
        if not highest or deb_version_compare(version, highest) > 0:
            highest = version
    return highest


def apt_madison(output: str | Sequence[str]) -> dict[str, list[str]]:
    """`apt-cache madison`'s output as package -> the versions it lists, in its order (newest first).

    output: the command's stdout, or its stdout_lines. A record reads `package | version | source`, the
    first two padded; a line without '|' is none. A version offered by several sources is listed once
    for each, as madison lists it; a deb-src line names the source package.
    """
    lines = output.splitlines() if isinstance(output, str) else output
    if not isinstance(lines, Sequence) or not all(isinstance(line, str) for line in lines):
        raise AnsibleFilterError(f"apt_madison expects apt-cache madison's stdout or stdout_lines, got {output!r}")
    offered: dict[str, list[str]] = {}
    for line in lines:
        if "|" not in line:
            continue
        fields = [field.strip() for field in line.split("|")]
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise AnsibleFilterError(f"not an apt-cache madison record (package | version | source): {line!r}")
        offered.setdefault(fields[0], []).append(fields[1])
    return offered


def apt_offered_at(offered: Mapping[str, Sequence[str]], version: str) -> dict[str, str]:
    """package -> the first version apt_madison lists for it that matches version; packages with none left out.

    version: an apt version glob as the roles pin it (535.261.03-*): '*' is any run of characters, the rest
    is literal and the whole version must match.
    """
    if not isinstance(offered, Mapping):
        raise AnsibleFilterError(f"apt_offered_at expects apt_madison's mapping, got {offered!r}")
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        version = str(version)  # an unquoted YAML pin (12.4) arrives as a number
    if not isinstance(version, str):
        raise AnsibleFilterError(f"apt_offered_at expects an apt version glob, got {version!r}")
    pattern = re.compile(re.escape(version).replace(r"\*", ".*"))
    found: dict[str, str] = {}
    for package, versions in offered.items():
        match = next((candidate for candidate in versions if pattern.fullmatch(candidate)), None)
        if match is not None:
            found[package] = match
    return found


def _runc_is_fixed(version: str, release: str, min_version: str, backports: Mapping[str, Mapping[str, str]]) -> bool:
    """A runc build at or above min_version upstream, or at or above its release's backported fix."""
    if deb_version_compare(deb_upstream_version(version), min_version) >= 0:
        return True
    fixed = (backports.get(min_version) or {}).get(release)
    return fixed is not None and deb_version_compare(version, fixed) >= 0


def _runc_escape_text(what: str, min_version: str, backports: Mapping[str, Mapping[str, str]]) -> str:
    builds = ", ".join(f"{name} {build}" for name, build in sorted((backports.get(min_version) or {}).items()))
    return (
        f"{what}, which is open to CVE-2024-21626 and any other escape fixed by runc {min_version} (runc before "
        "1.1.12 leaks a host directory's file descriptor into the container: a process in it can reach the host's "
        f"filesystem and escape). Pin a runc that carries the fix: upstream {min_version} or later, or a "
        f"distribution build known to have it backported{' (' + builds + ', or later)' if builds else ''}"
    )


def _check_backports(backports: Any) -> None:
    if not isinstance(backports, Mapping):
        raise AnsibleFilterError(f"the runc checks expect a mapping of backports, got {backports!r}")


def docker_runc_problem(
    packages: Sequence[Mapping[str, Any]],
    release: str,
    min_version: str,
    backports: Mapping[str, Mapping[str, str]],
) -> str:
    """Why the runc that docker_packages pins is open to the escape min_version fixes; empty when it is not.

    packages: docker_packages ({name, version} each).
    release: the host's <distribution>-<major version>, e.g. Ubuntu-22.
    min_version: the first upstream runc release with the fix (1.1.12 for CVE-2024-21626).
    backports: upstream version -> release -> the first build of that release's runc that carries that
      version's fix backported into an older upstream version (Debian's 1.1.5+ds1-1+deb12u1). A build at
      or above it is fixed; so is any build whose upstream part is at least min_version.
    Without a runc pin (Docker CE's containerd.io bundles its own) there is nothing to check here:
    installed_runc_problem checks what was installed, whichever package brought it.
    """
    if not isinstance(packages, Sequence) or isinstance(packages, str):
        raise AnsibleFilterError(f"docker_runc_problem expects docker_packages (a list), got {packages!r}")
    _check_backports(backports)
    _split(min_version)
    pins = [package for package in packages if isinstance(package, Mapping) and package.get("name") == "runc"]
    if not pins:
        return ""
    version = str(pins[0].get("version", ""))
    if _runc_is_fixed(version, release, min_version, backports):
        return ""
    return (
        _runc_escape_text(f"docker_packages pins runc {version}", min_version, backports)
        + ". `apt-cache policy runc` on the host lists what its sources offer; the role's default"
        " (roles/docker/vars/<release>.yml) pins a fixed one for each supported release."
        " Pin containerd and docker.io of the same set with it."
    )


_RUNC_VERSION_LINE = re.compile(r"^runc version (\S+)", re.MULTILINE)


def installed_runc_problem(
    version_output: str,
    package_version: str,
    release: str,
    min_version: str,
    backports: Mapping[str, Mapping[str, str]],
) -> str:
    """Why the runc installed on the host is open to the escape min_version fixes; empty when it is not.

    version_output: what `runc --version` printed (the binary dockerd runs, from any package).
    package_version: the installed version of the distribution's runc package, or '' when the binary came
      from elsewhere (Docker CE's containerd.io bundles its own runc). A distribution build is judged by
      its package version, which names a backported fix; any other by the upstream version it reports.
    """
    _check_backports(backports)
    _split(min_version)
    if package_version:
        if _runc_is_fixed(package_version, release, min_version, backports):
            return ""
        return _runc_escape_text(f"the host runs runc {package_version} (package runc)", min_version, backports) + (
            ". Set docker_packages to a fixed set (roles/docker/vars/<release>.yml has one) and run the role again."
        )
    match = _RUNC_VERSION_LINE.search(version_output or "")
    if match is None:
        raise AnsibleFilterError(f"`runc --version` printed no 'runc version' line: {version_output!r}")
    reported = match.group(1)
    if _runc_is_fixed(reported, release, min_version, {}):  # no backport table: not a distribution build
        return ""
    return _runc_escape_text(f"the host runs runc {reported} (not the distribution's package)", min_version, {}) + (
        ". Docker CE's containerd.io bundles runc: pin a containerd.io whose runc carries the fix"
        " (`runc --version` after the install tells)."
    )


def apt_names_matching(names: Sequence[str], globs: Sequence[str]) -> list[str]:
    """The names that a preferences record with these Package: globs pins, matched as apt matches them (fnmatch):
    `['libnvidia-ml1', 'curl'] | apt_names_matching(['*nvidia*'])` is ['libnvidia-ml1']."""
    if isinstance(globs, str):
        raise AnsibleFilterError(f"apt_names_matching takes a list of globs, not the string {globs!r}")
    return [name for name in names if any(fnmatchcase(name, glob) for glob in globs)]


class FilterModule:
    """llmfleet package version filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "deb_version_compare": deb_version_compare,
            "deb_upstream_version": deb_upstream_version,
            "deb_version_max": deb_version_max,
            "apt_madison": apt_madison,
            "apt_offered_at": apt_offered_at,
            "apt_names_matching": apt_names_matching,
            "docker_runc_problem": docker_runc_problem,
            "installed_runc_problem": installed_runc_problem,
        }
