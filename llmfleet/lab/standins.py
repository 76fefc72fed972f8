"""`llmfleet standins build`: a local apt repository of STAND-IN NVIDIA packages.

llmfleet STAND-IN packages are NOT NVIDIA's packages. They carry the real names
and versions that the roles nvidia_driver, cuda and nvidia_container_toolkit
install (nvidia-driver 535.261.03-1, cuda-toolkit-12-1 12.1.1-1,
nvidia-container-toolkit 1.18.2-1, ...), and nothing that drives a GPU: every
Description starts with STANDIN_LABEL and every command they ship says
STAND-IN. With them, the roles' Molecule scenarios and the lab's GPU-less hosts
run the roles' real logic: repository setup, apt pin, install at the exact
version, dpkg hold, version checks, services, idempotence.

The packages are listed in files/standins/packages.yml; the CUDA toolkit ones
are derived from the version table (playbooks/vars/stacks.yml). Each is built
with equivs-build, and dpkg-scanpackages indexes them into a flat repository
(`deb [trusted=yes] file:/srv/llmfleet-standins ./` on a host). The result is
cached under llmfleet.paths.cache_dir() by a key over everything that shapes
it, and also packed as a .tar.gz that test scenarios copy to their hosts.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT, cache_dir
from llmfleet.stacks import STACKS_FILE, load_stacks

log = logging.getLogger(__name__)

STANDINS_DIR = REPO_ROOT / "files" / "standins"
SPEC_FILE = STANDINS_DIR / "packages.yml"
# Where the scenarios and the lab put the repository on a host.
HOST_PATH = "/srv/llmfleet-standins"
APT_LINE = f"deb [trusted=yes] file:{HOST_PATH} ./"
STANDIN_LABEL = "llmfleet STAND-IN: not NVIDIA's package"
MAINTAINER = "llmfleet stand-ins <standins@llmfleet.invalid>"
# Part of the content key, with this file's own text: any change to the recipe
# builds a new repository, and a stale one is never picked.
RECIPE_VERSION = "1"
ARCHIVE_NAME = "llmfleet-standins.tar.gz"
EQUIVS_TEMPLATES = Path("/usr/share/equivs/template")
TOOLS = {"equivs-build": "equivs", "dpkg-scanpackages": "dpkg-dev"}
_PLACEHOLDER_RE = re.compile(r"@[A-Z][A-Z0-9_]*@")
_CUDA_PACKAGE_RE = re.compile(r"^cuda-[a-z-]+-(?P<major>\d+)-(?P<minor>\d+)$")


@dataclass(frozen=True)
class StandInFile:
    """A file of files/standins/ that a stand-in installs at dest."""

    src: str
    dest: str


@dataclass(frozen=True)
class StandIn:
    """One stand-in .deb: a real package name at one real version."""

    name: str
    version: str
    origin: str
    section: str
    summary: str
    depends: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    files: tuple[StandInFile, ...] = ()
    variables: tuple[tuple[str, str], ...] = field(default=())

    @property
    def upstream(self) -> str:
        """The version without its Debian revision: 535.261.03 for 535.261.03-1."""
        return self.version.rsplit("-", 1)[0] if "-" in self.version else self.version

    @property
    def filename(self) -> str:
        version = self.version.split(":", 1)[-1]
        return f"{self.name}_{version}_all.deb"

    def expand(self, text: str) -> str:
        """Fill {version} and {upstream} in a dependency or summary."""
        return text.replace("{version}", self.version).replace("{upstream}", self.upstream)

    def placeholders(self) -> dict[str, str]:
        values = {"PACKAGE": self.name, "VERSION": self.version, "UPSTREAM": self.upstream}
        values.update(dict(self.variables))
        return values


@dataclass(frozen=True)
class Repository:
    """A built stand-in repository."""

    key: str
    path: Path
    archive: Path
    packages: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "path": str(self.path),
            "archive": str(self.archive),
            "host_path": HOST_PATH,
            "apt_line": APT_LINE,
            "packages": list(self.packages),
        }


# ---------------------------------------------------------------------------
# The package list
# ---------------------------------------------------------------------------


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise LlmfleetError(f"{SPEC_FILE}: {what} must be a list of strings")
    return tuple(value)


def _listed(spec: Mapping[str, Any]) -> list[StandIn]:
    standins: list[StandIn] = []
    for entry in spec.get("packages") or []:
        name = entry.get("name")
        versions = entry.get("versions")
        if not isinstance(name, str) or not isinstance(versions, dict) or not versions:
            raise LlmfleetError(f"{SPEC_FILE}: every package needs a name and a `versions` mapping: {entry!r}")
        files = tuple(StandInFile(str(item["src"]), str(item["dest"])) for item in entry.get("files") or [])
        variables = tuple((str(key), str(value)) for key, value in (entry.get("vars") or {}).items())
        for version, origin in versions.items():
            standins.append(
                StandIn(
                    name=name,
                    version=str(version),
                    origin=str(origin),
                    section=str(entry.get("section", "misc")),
                    summary=str(entry.get("summary", name)),
                    depends=_strings(entry.get("depends"), f"{name}: depends"),
                    recommends=_strings(entry.get("recommends"), f"{name}: recommends"),
                    provides=_strings(entry.get("provides"), f"{name}: provides"),
                    files=files,
                    variables=variables,
                )
            )
    return standins


def _cuda(spec: Mapping[str, Any], stacks: Mapping[str, Mapping[str, Any]]) -> list[StandIn]:
    """Stand-ins for every CUDA package the version table names, at <cuda.version>-1."""
    cuda = spec.get("cuda") or {}
    nvcc_src = str(cuda.get("nvcc_src", "nvcc"))
    standins: dict[tuple[str, str], StandIn] = {}
    for stack_name, stack in sorted(stacks.items()):
        toolkit = stack.get("cuda") or {}
        cuda_version = str(toolkit.get("version", ""))
        packages = toolkit.get("packages") or {}
        for names in packages.values():
            for name in names:
                match = _CUDA_PACKAGE_RE.match(name)
                if not match:
                    raise LlmfleetError(
                        f"{STACKS_FILE}: stack {stack_name}: no stand-in recipe for CUDA package {name!r} "
                        "(expected cuda-<piece>-<major>-<minor>); extend llmfleet/lab/standins.py"
                    )
                major, minor = match["major"], match["minor"]
                version = f"{cuda_version}-1"
                nvcc = f"cuda-nvcc-{major}-{minor}"
                variables = (
                    ("CUDA_VERSION", cuda_version),
                    ("CUDA_MAJOR_MINOR", f"{major}.{minor}"),
                )
                standins[(nvcc, version)] = StandIn(
                    name=nvcc,
                    version=version,
                    origin=(
                        f"NVIDIA CUDA repository (CUDA {cuda_version}; stack {stack_name}), where it carries "
                        "nvcc's own version; the stand-in carries the toolkit's"
                    ),
                    section=str(cuda.get("section", "devel")),
                    summary=str(cuda.get("nvcc_summary", "CUDA nvcc")),
                    files=(StandInFile(nvcc_src, f"/usr/local/cuda-{major}.{minor}/bin/nvcc"),),
                    variables=variables,
                )
                if name != nvcc:
                    summary = str(cuda.get("summary", "CUDA Toolkit {major}.{minor}"))
                    standins[(name, version)] = StandIn(
                        name=name,
                        version=version,
                        origin=f"NVIDIA CUDA repository (CUDA {cuda_version}; stack {stack_name})",
                        section=str(cuda.get("section", "devel")),
                        summary=summary.replace("{major}", major).replace("{minor}", minor),
                        depends=(f"{nvcc} (= {version})",),
                        variables=variables,
                    )
    return [standins[key] for key in sorted(standins)]


def load_standins(spec_file: Path = SPEC_FILE, stacks_file: Path = STACKS_FILE) -> list[StandIn]:
    """Every stand-in to build: the listed ones, then the CUDA ones from the table."""
    try:
        spec = yaml.safe_load(spec_file.read_text(encoding="utf-8"))
    except OSError as error:
        raise LlmfleetError(f"cannot read {spec_file}: {error.strerror}") from error
    if not isinstance(spec, dict):
        raise LlmfleetError(f"{spec_file} must be a mapping with `packages` and `cuda`")
    standins = _listed(spec) + _cuda(spec, load_stacks(stacks_file))
    seen: set[tuple[str, str]] = set()
    for standin in standins:
        if (standin.name, standin.version) in seen:
            raise LlmfleetError(f"{spec_file}: {standin.name} {standin.version} is listed twice")
        seen.add((standin.name, standin.version))
        for item in standin.files:
            if not (spec_file.parent / item.src).is_file():
                raise LlmfleetError(f"{spec_file}: {standin.name}: file {item.src} is not in {spec_file.parent}")
    return standins


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def render_file(standin: StandIn, text: str) -> str:
    """A file of files/standins/ with the stand-in's @NAME@ placeholders filled."""
    for name, value in standin.placeholders().items():
        text = text.replace(f"@{name}@", value)
    left = sorted(set(_PLACEHOLDER_RE.findall(text)))
    if left:
        raise LlmfleetError(f"{standin.name} {standin.version}: no value for {', '.join(left)}")
    return text


def control_file(standin: StandIn, sources: Mapping[str, str]) -> str:
    """The equivs control file; sources maps each file's dest to its rendered copy."""
    lines = [
        "Section: " + standin.section,
        "Priority: optional",
        "Standards-Version: 4.5.0",
        "",
        "Package: " + standin.name,
        "Version: " + standin.version,
        "Maintainer: " + MAINTAINER,
        "Architecture: all",
    ]
    for field_name, values in (
        ("Depends", standin.depends),
        ("Recommends", standin.recommends),
        ("Provides", standin.provides),
    ):
        if values:
            lines.append(f"{field_name}: " + ", ".join(standin.expand(value) for value in values))
    pairs = [f"{source} {Path(dest).parent}/" for dest, source in sources.items()]
    if pairs:
        # equivs reads the first pair on the field's own line, the rest indented.
        lines.append("Files: " + "\n ".join(pairs))
    body = (
        f"This is an llmfleet STAND-IN for {standin.name} {standin.version}, which is published in: "
        f"{standin.origin}. It has the real package's name and version and none of its contents: no "
        "driver, no kernel module, no CUDA library, no container runtime. Its commands print STAND-IN. "
        "llmfleet's Molecule scenarios and lab install it to test the roles' repository, pin, hold and "
        "version logic without a GPU. Built by `llmfleet standins build` from files/standins/."
    )
    lines.append(f"Description: {STANDIN_LABEL} ({standin.expand(standin.summary)})")
    lines += [f" {line}" for line in textwrap.wrap(body, width=76)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def content_key(standins: Sequence[StandIn], standins_dir: Path = STANDINS_DIR) -> str:
    """A hash of everything that shapes the repository."""
    digest = hashlib.sha256()
    digest.update(RECIPE_VERSION.encode())
    digest.update(json.dumps([asdict(standin) for standin in standins], sort_keys=True).encode())
    # The recipe itself: a change to this file rebuilds (RECIPE_VERSION documents intent).
    digest.update(Path(__file__).read_bytes())
    for path in sorted(standins_dir.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + str(os.access(path, os.X_OK)).encode())
    return digest.hexdigest()[:12]


def ensure_tools() -> None:
    """equivs-build and dpkg-scanpackages, installed from the machine's own apt when missing."""
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    command = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise LlmfleetError(f"building the stand-in packages needs {', '.join(missing)}: {' '.join(command)} (as root)")
    log.warning("Installing %s to build the stand-in packages", " ".join(missing))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise LlmfleetError(f"{' '.join(command)} failed:\n{result.stderr.strip()[-1500:]}")


def _templates(directory: Path) -> Path:
    """equivs' own templates, with debhelper's dh_usrlocal turned off.

    NVIDIA's CUDA packages install into /usr/local/cuda-X.Y, which Debian policy
    (and so dh_usrlocal) refuses; the stand-ins must install where they do.
    """
    templates = directory / "equivs-templates"
    shutil.copytree(EQUIVS_TEMPLATES, templates)
    rules = templates / "debian" / "rules"
    rules.write_text(
        rules.read_text(encoding="utf-8") + "\n# llmfleet: CUDA installs into /usr/local, as NVIDIA's packages do.\n"
        "override_dh_usrlocal:\n",
        encoding="utf-8",
    )
    return templates


def _build_one(standin: StandIn, standins_dir: Path, output: Path, templates: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix=f"{standin.name}-") as work:
        workdir = Path(work)
        sources: dict[str, str] = {}
        for number, item in enumerate(standin.files):
            source = standins_dir / item.src
            rendered = workdir / f"file{number}" / Path(item.dest).name
            rendered.parent.mkdir()
            rendered.write_text(render_file(standin, source.read_text(encoding="utf-8")), encoding="utf-8")
            rendered.chmod(0o755 if os.access(source, os.X_OK) else 0o644)
            sources[item.dest] = str(rendered)
        control = workdir / "control"
        control.write_text(control_file(standin, sources), encoding="utf-8")
        result = subprocess.run(
            ["equivs-build", f"--templates={templates}", str(control)],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "SOURCE_DATE_EPOCH": "0", "LC_ALL": "C.UTF-8"},
        )
        built = workdir / standin.filename
        if result.returncode != 0 or not built.is_file():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise LlmfleetError(f"equivs-build {standin.name} {standin.version} failed:\n{tail}")
        return Path(shutil.move(str(built), output / standin.filename))


def _index(repo: Path) -> None:
    """Packages, Packages.gz and an unsigned Release: a flat repository."""
    result = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LlmfleetError(f"dpkg-scanpackages failed: {result.stderr.strip()}")
    packages = result.stdout.encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = [
        "Origin: llmfleet-standins",
        "Label: llmfleet STAND-IN packages (not NVIDIA's)",
        "Suite: standins",
        "Codename: standins",
        f"Date: {formatdate(0, usegmt=True)}",
        "Architectures: all amd64 arm64",
        "Description: llmfleet STAND-IN packages: real names and versions, no vendor contents",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data):>8} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n", encoding="ascii")


def _pack(repo: Path, archive: Path) -> None:
    """A .tar.gz of the repository's files, with fixed owners and times."""

    def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(repo.iterdir()):
            tar.add(path, arcname=path.name, filter=_normalise)


def build(force: bool = False, workers: int | None = None) -> Repository:
    """Build the repository, or return the cached one built from the same inputs."""
    standins = load_standins()
    key = content_key(standins)
    root = cache_dir() / "standins"
    target = root / key
    names = tuple(f"{standin.name}={standin.version}" for standin in standins)
    repository = Repository(key=key, path=target / "repo", archive=target / ARCHIVE_NAME, packages=names)
    if target.is_dir() and not force:
        return repository
    ensure_tools()
    root.mkdir(parents=True, exist_ok=True)
    log.warning("Building %d stand-in packages with equivs", len(standins))
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{key}-") as work:
        staging = Path(work) / key
        repo = staging / "repo"
        repo.mkdir(parents=True)
        templates = _templates(Path(work))
        with ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2)) as pool:
            list(pool.map(lambda standin: _build_one(standin, STANDINS_DIR, repo, templates), standins))
        _index(repo)
        _pack(repo, staging / ARCHIVE_NAME)
        if force and target.exists():
            shutil.rmtree(target)
        try:
            # Rename only once complete, so a killed build never looks cached.
            staging.rename(target)
        except OSError:
            # Another build of the same key finished first: it is the same repository.
            if not target.is_dir():
                raise
    return repository


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    standins = subparsers.add_parser(
        "standins",
        help="the local apt repository of STAND-IN NVIDIA packages (tests and the lab)",
        description=(
            "llmfleet STAND-IN packages are NOT NVIDIA's: they carry the real names and versions "
            "the GPU roles install and none of the contents."
        ),
    )
    actions = standins.add_subparsers(dest="standins_command", required=True, metavar="ACTION")
    build_parser = actions.add_parser("build", help="build (or reuse) the stand-in repository and print where it is")
    build_parser.add_argument("--force", action="store_true", help="rebuild even when the cached key exists")
    build_parser.add_argument("--json", action="store_true", help="print {key, path, archive, apt_line, ...} as JSON")
    build_parser.set_defaults(handler=_build)
    list_parser = actions.add_parser("list", help="print every stand-in package and where the real one comes from")
    list_parser.set_defaults(handler=_list)


def _build(args: argparse.Namespace) -> int:
    repository = build(force=args.force)
    if args.json:
        print(json.dumps(repository.as_dict(), indent=2))
    else:
        print(f"{len(repository.packages)} STAND-IN packages in {repository.path}")
        print(f"archive: {repository.archive}")
        print(f"on a host, unpacked into {HOST_PATH}: {APT_LINE}")
    return 0


def _list(_args: argparse.Namespace) -> int:
    for standin in load_standins():
        print(f"{standin.name:<32} {standin.version:<24} real: {standin.origin}")
    return 0


def packages_index(repo: Path) -> list[dict[str, str]]:
    """The stanzas of a repository's Packages file (for tests and checks)."""
    stanzas: list[dict[str, str]] = []
    for block in (repo / "Packages").read_text(encoding="utf-8").split("\n\n"):
        fields: dict[str, str] = {}
        current = ""
        for line in block.splitlines():
            if line.startswith(" ") and current:
                fields[current] += "\n" + line[1:]
            elif ":" in line:
                current, value = line.split(":", 1)
                fields[current] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas
