"""Version strings as the stack table and the hosts give them: parsed, compared, formatted."""

from __future__ import annotations

import re
from functools import total_ordering

# Versions are compared on their numeric release parts padded with zeros, so
# "570.26" == "570.26.0" and "535.104.05" < "535.104.12" (NVIDIA zero-pads).
_MAX_PARTS = 5
_VERSION_RE = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:\.?post(?P<post>\d+))?"
    r"(?:\+(?P<local>[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*))?$"
)
_CUDA_TAG_RE = re.compile(r"^cu(?P<major>\d+)(?P<minor>\d)$")
_COMPUTE_CAPABILITY_RE = re.compile(r"^(?:(?P<major>\d+)\.(?P<minor>\d+)|(?:sm|compute)_?(?P<packed>\d{2,3}))$")


@total_ordering
class Version:
    """A release version such as 535.104.05, 12.1.1 or 2.3.0+cu121.

    Only the numeric release parts take part in comparisons; the local label
    (``cu121`` in ``2.3.0+cu121``) is kept for the callers that need it.
    """

    __slots__ = ("local", "release", "text")

    def __init__(self, release: tuple[int, ...], local: str | None = None, text: str = "") -> None:
        if not release or len(release) > _MAX_PARTS or any(part < 0 for part in release):
            raise ValueError(f"a version has 1 to {_MAX_PARTS} non-negative parts, got {release!r}")
        self.release = release
        self.local = local
        self.text = text or ".".join(str(part) for part in release) + (f"+{local}" if local else "")

    def _key(self) -> tuple[int, ...]:
        return self.release + (0,) * (_MAX_PARTS - len(self.release))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Version({self.text!r})"

    def __str__(self) -> str:
        return self.text

    @property
    def major(self) -> int:
        return self.release[0]

    @property
    def minor(self) -> int:
        return self.release[1] if len(self.release) > 1 else 0

    @property
    def update(self) -> int | None:
        """The third part (CUDA's "Update N"), or None when it was not given."""
        return self.release[2] if len(self.release) > 2 else None

    def public(self) -> str:
        """The release without the local label: 2.3.0+cu121 -> 2.3.0."""
        return ".".join(str(part) for part in self.release)


def _parse(
    value: object, what: str, example: str, parts: tuple[int, int], allow_local: bool = False, allow_post: bool = False
) -> Version:
    if not isinstance(value, str):
        # YAML turns an unquoted 12.10 into the float 12.1: refuse rather than guess.
        raise ValueError(
            f"{what} must be a string such as {example!r}, got {value!r} ({type(value).__name__});"
            " quote versions in YAML"
        )
    text = value.strip()
    if not text:
        raise ValueError(f"{what} is empty; give a version such as {example!r}")
    match = _VERSION_RE.match(text)
    if match is None:
        raise ValueError(f"{what} {value!r} is not a version; expected something like {example!r}")
    if match.group("post") is not None and not allow_post:
        raise ValueError(f"{what} {value!r} has a post-release suffix; expected something like {example!r}")
    local = match.group("local")
    if local is not None and not allow_local:
        raise ValueError(f"{what} {value!r} has a '+' label; expected something like {example!r}")
    release = tuple(int(part) for part in match.group("release").split("."))
    low, high = parts
    if not low <= len(release) <= high:
        span = f"{low}" if low == high else f"{low} to {high}"
        raise ValueError(f"{what} {value!r} must have {span} dot-separated numbers, like {example!r}")
    return Version(release, local, text.lstrip("v"))


def parse_driver_version(value: object) -> Version:
    """An NVIDIA Linux driver version as nvidia-smi prints it: 535.104.05 or 570.26."""
    return _parse(value, "NVIDIA driver version", "535.104.05", (2, 3))


def parse_cuda_version(value: object) -> Version:
    """A CUDA toolkit version: 12.1 (any update, judged as GA) or 12.1.1 (Update 1)."""
    return _parse(value, "CUDA version", "12.1.1", (2, 3))


def parse_torch_version(value: object) -> Version:
    """A PyTorch version, with or without its wheel label: 2.3.0 or 2.3.0+cu121."""
    return _parse(value, "PyTorch version", "2.3.0+cu121", (2, 3), allow_local=True)


def parse_vllm_version(value: object) -> Version:
    """A vLLM version: 0.4.2, 0.10.1.1 or 0.5.0.post1 (the post part is ignored)."""
    return _parse(value, "vLLM version", "0.4.2", (2, 4), allow_post=True)


def parse_transformers_version(value: object) -> Version:
    """A Hugging Face transformers version: 4.40.2."""
    return _parse(value, "transformers version", "4.40.2", (2, 3))


def parse_peft_version(value: object) -> Version:
    """A PEFT version: 0.11.1."""
    return _parse(value, "PEFT version", "0.11.1", (2, 3))


def parse_compute_capability(value: object) -> tuple[int, int]:
    """A compute capability: 8.9, sm_89, sm_100 or compute_90 -> (major, minor)."""
    if not isinstance(value, str):
        raise ValueError(f"compute capability must be a string such as '8.9', got {value!r}")
    match = _COMPUTE_CAPABILITY_RE.match(value.strip().lower())
    if match is None:
        raise ValueError(f"compute capability {value!r} is not of the form '8.9' or 'sm_89'")
    if match.group("packed") is not None:
        packed = match.group("packed")
        return int(packed[:-1]), int(packed[-1])
    return int(match.group("major")), int(match.group("minor"))


def cuda_tag_version(tag: str) -> Version:
    """The CUDA version of a PyTorch wheel label: cu121 -> 12.1, cu118 -> 11.8."""
    match = _CUDA_TAG_RE.match(tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a CUDA wheel label such as 'cu121'")
    return Version((int(match.group("major")), int(match.group("minor"))))


def cuda_tag(cuda: Version) -> str:
    """The PyTorch wheel label for a CUDA version: 12.1.1 -> cu121."""
    return f"cu{cuda.major}{cuda.minor}"


def format_compute_capability(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"
