"""The vendors' compatibility tables (each names its source), and lookups into them."""

from __future__ import annotations

import re

from .versions import Version, parse_cuda_version, parse_driver_version

CUDA_RELEASE_NOTES = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html"
CUDA_MINOR_VERSION_COMPAT = "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"
PYTORCH_RELEASE_MATRIX = "https://github.com/pytorch/pytorch/blob/main/RELEASE.md#release-compatibility-matrix"
PYTORCH_PREVIOUS_VERSIONS = "https://pytorch.org/get-started/previous-versions/"
PYTORCH_CPP_EXTENSION = "https://github.com/pytorch/pytorch/blob/main/torch/utils/cpp_extension.py"
VLLM_RELEASES = "https://github.com/vllm-project/vllm/releases"
VLLM_RELEASE_NOTES_PAGE = "https://vllm.ai/releases"
CUDA_GPUS = "https://developer.nvidia.com/cuda-gpus"

# Minimum Linux x86_64 driver for each CUDA toolkit release.
# Source: CUDA Toolkit release notes, "Table 3 CUDA Toolkit and Corresponding
# Driver Versions" (CUDA_RELEASE_NOTES; the CUDA 13.2 Update 2 edition of the
# table, which lists every release back to 7.0). Copied row by row; the
# 12.1 rows are also in the 12.1.1 archive notes:
# https://docs.nvidia.com/cuda/archive/12.1.1/cuda-toolkit-release-notes/index.html
# Keys are (major, minor, update). Releases before 11.0 are keyed by major.minor
# only (their third number is a build, not an update) and the 11.0.1 RC row is
# left out. Only the rows needed for the GPU rules are kept below 11.0.
CUDA_TOOLKIT_MIN_DRIVER: dict[tuple[int, int, int], str] = {
    (13, 2, 2): "595.71.05",
    (13, 2, 1): "595.58.03",
    (13, 2, 0): "595.45.04",
    (13, 1, 1): "590.48.01",
    (13, 1, 0): "590.44.01",
    (13, 0, 2): "580.95.05",
    (13, 0, 1): "580.82.07",
    (13, 0, 0): "580.65.06",
    (12, 9, 1): "575.57.08",
    (12, 9, 0): "575.51.03",
    (12, 8, 1): "570.124.06",
    (12, 8, 0): "570.26",
    (12, 6, 3): "560.35.05",
    (12, 6, 2): "560.35.03",
    (12, 6, 1): "560.35.03",
    (12, 6, 0): "560.28.03",
    (12, 5, 1): "555.42.06",
    (12, 5, 0): "555.42.02",
    (12, 4, 1): "550.54.15",
    (12, 4, 0): "550.54.14",
    (12, 3, 1): "545.23.08",
    (12, 3, 0): "545.23.06",
    (12, 2, 2): "535.104.05",
    (12, 2, 1): "535.86.09",
    (12, 2, 0): "535.54.03",
    (12, 1, 1): "530.30.02",
    (12, 1, 0): "530.30.02",
    (12, 0, 1): "525.85.12",
    (12, 0, 0): "525.60.13",
    (11, 8, 0): "520.61.05",
    (11, 7, 1): "515.48.07",
    (11, 7, 0): "515.43.04",
    (11, 6, 2): "510.47.03",
    (11, 6, 1): "510.47.03",
    (11, 6, 0): "510.39.01",
    (11, 5, 2): "495.29.05",
    (11, 5, 1): "495.29.05",
    (11, 5, 0): "495.29.05",
    (11, 4, 4): "470.82.01",
    (11, 4, 3): "470.82.01",
    (11, 4, 2): "470.57.02",
    (11, 4, 1): "470.57.02",
    (11, 4, 0): "470.42.01",
    (11, 3, 1): "465.19.01",
    (11, 3, 0): "465.19.01",
    (11, 2, 2): "460.32.03",
    (11, 2, 1): "460.32.03",
    (11, 2, 0): "460.27.03",
    (11, 1, 1): "455.32",
    (11, 1, 0): "455.23",
    (11, 0, 3): "450.51.06",
    (11, 0, 2): "450.51.05",  # 11.0 GA (11.0.1 was the RC, left out)
    (10, 2, 0): "440.33",  # CUDA 10.2.89
    (10, 1, 0): "418.39",  # CUDA 10.1.105 and its updates
    (10, 0, 0): "410.48",  # CUDA 10.0.130
    (9, 0, 0): "384.81",  # CUDA 9.0.76
}

# CUDA wheel labels PyTorch published for each minor release (stable and
# experimental columns; CPU and ROCm wheels aside). Source: PyTorch's
# "Release Compatibility Matrix" (PYTORCH_RELEASE_MATRIX), cross-checked for
# 2.1-2.3 against the install commands on PYTORCH_PREVIOUS_VERSIONS
# (2.3.0: cu118 and cu121). Patch releases share their minor's labels.
TORCH_CUDA_TAGS: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 1): ("cu118", "cu121"),
    (2, 2): ("cu118", "cu121"),
    (2, 3): ("cu118", "cu121"),
    (2, 4): ("cu118", "cu121", "cu124"),
    (2, 5): ("cu118", "cu121", "cu124"),
    (2, 6): ("cu118", "cu124", "cu126"),
    (2, 7): ("cu118", "cu126", "cu128"),
    (2, 8): ("cu126", "cu128", "cu129"),
    (2, 9): ("cu126", "cu128", "cu130"),
}

# The exact PyTorch each vLLM release pins ("torch == X" in its published
# package metadata, Requires-Dist). Read from the released packages' metadata
# for this table; release notes: VLLM_RELEASES (v0.4.2 follows PR #4454
# "Upgrade to torch==2.3.0"; v0.9.0 notes: "vLLM has upgraded to PyTorch 2.7",
# default wheel CUDA 12.8). Only releases checked that way are listed.
VLLM_TORCH: dict[tuple[int, ...], str] = {
    (0, 4, 2): "2.3.0",
    (0, 9, 0): "2.7.0",
    (0, 9, 1): "2.7.0",
    (0, 9, 2): "2.7.0",
    (0, 10, 2): "2.8.0",
    (0, 11, 0): "2.8.0",
}

# The transformers each vLLM release accepts: (minimum, first refused or None).
# Minimums are the "transformers >= X" of each release's published package
# metadata (Requires-Dist; requirements-common.txt / requirements/common.txt in
# the release's source). vLLM 0.9.x also breaks on transformers 4.54: vLLM's
# release page (VLLM_RELEASE_NOTES_PAGE) says "vLLM v0.9.x: These versions
# require transformers < 4.54.0". Same releases as VLLM_TORCH (a test checks).
VLLM_TRANSFORMERS: dict[tuple[int, ...], tuple[str, str | None]] = {
    (0, 4, 2): ("4.40.0", None),
    (0, 9, 0): ("4.51.1", "4.54.0"),
    (0, 9, 1): ("4.51.1", "4.54.0"),
    (0, 9, 2): ("4.51.1", "4.54.0"),
    (0, 10, 2): ("4.55.2", None),
    (0, 11, 0): ("4.55.2", None),
}

# First CUDA toolkit that compiles native code for each compute capability.
# Sources: NVIDIA's architecture compatibility guides, whose "Building
# Applications Using CUDA Toolkit X" sections name the first toolkit:
#   7.0 Volta  - CUDA 9.0  https://docs.nvidia.com/cuda/volta-compatibility-guide/
#   7.5 Turing - CUDA 10.0 https://docs.nvidia.com/cuda/turing-compatibility-guide/
#   8.0 Ampere - CUDA 11.0 https://docs.nvidia.com/cuda/ampere-compatibility-guide/
#   8.6 Ampere - CUDA 11.1 (NVIDIA forum answer, "the earliest version that
#       supported cc8.6 is CUDA 11.1":
#       https://forums.developer.nvidia.com/t/minimum-required-cuda-version-by-gpu/276955)
#   8.9 Ada    - CUDA 11.8 https://docs.nvidia.com/cuda/ada-compatibility-guide/
#   9.0 Hopper - CUDA 11.8 https://docs.nvidia.com/cuda/hopper-compatibility-guide/
#   10.0 and 12.0 Blackwell - CUDA 12.8 https://docs.nvidia.com/cuda/blackwell-compatibility-guide/
# Not listed (not verified here): 10.3 (B300), 12.1 (GB10), Jetson parts.
COMPUTE_CAPABILITY_MIN_CUDA: dict[tuple[int, int], str] = {
    (7, 0): "9.0",
    (7, 5): "10.0",
    (8, 0): "11.0",
    (8, 6): "11.1",
    (8, 9): "11.8",
    (9, 0): "11.8",
    (10, 0): "12.8",
    (12, 0): "12.8",
}

# CUDA 13.0 removed offline compilation and library support for Maxwell, Pascal
# and Volta (compute capability below 7.5): "newer toolkits will be unable to
# target these architectures" (CUDA_RELEASE_NOTES, "Deprecated Architectures").
# So a GPU below 7.5 needs CUDA 12.x at most.
LAST_CUDA_MAJOR_BELOW_7_5 = 12

# Marketing names -> compute capability. Source: CUDA_GPUS (and its legacy page,
# https://developer.nvidia.com/cuda-legacy-gpus, for V100). Names are matched
# on whole words after dropping "NVIDIA", "GeForce" and "Tesla", so nvidia-smi
# names such as "NVIDIA A100-SXM4-80GB" or "Tesla T4" resolve. Only GPUs whose
# capability is in COMPUTE_CAPABILITY_MIN_CUDA are listed (a test enforces it).
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "B200": (10, 0),
    "GB200": (10, 0),
    "RTX PRO 6000 BLACKWELL": (12, 0),
    "RTX 5090": (12, 0),
    "RTX 5080": (12, 0),
    "H200": (9, 0),
    "H100": (9, 0),
    "GH200": (9, 0),
    "RTX 4090": (8, 9),
    "L40S": (8, 9),
    "L40": (8, 9),
    "L4": (8, 9),
    "RTX 6000 ADA": (8, 9),
    "RTX 4080": (8, 9),
    "RTX 4070 TI": (8, 9),
    "RTX 4070": (8, 9),
    "RTX 4060 TI": (8, 9),
    "RTX 4060": (8, 9),
    "A100": (8, 0),
    "A30": (8, 0),
    "A40": (8, 6),
    "A10": (8, 6),
    "A16": (8, 6),
    "A2": (8, 6),
    "RTX A6000": (8, 6),
    "RTX A5000": (8, 6),
    "RTX A4000": (8, 6),
    "RTX 3090": (8, 6),
    "RTX 3080": (8, 6),
    "T4": (7, 5),
    "V100": (7, 0),
}
_DROPPED_NAME_WORDS = frozenset({"NVIDIA", "GEFORCE", "TESLA"})


def min_driver_for_cuda(cuda: Version) -> Version | None:
    """The Table 3 minimum driver for a CUDA toolkit, or None if the release is unknown.

    12.1.1 picks the Update 1 row. A version without an update (12.1) picks the
    GA row, the least any 12.1 toolkit needs; pin the update to get its exact row.
    A later update than the table knows (12.8.2) uses the newest known row of
    that minor release.
    """
    rows = sorted(
        (update, driver)
        for (major, minor, update), driver in CUDA_TOOLKIT_MIN_DRIVER.items()
        if (major, minor) == (cuda.major, cuda.minor)
    )
    if not rows:
        return None
    wanted = cuda.update
    if wanted is None:
        return parse_driver_version(rows[0][1])
    known = [driver for update, driver in rows if update <= wanted]
    return parse_driver_version(known[-1]) if known else None


def min_cuda_for_compute_capability(capability: tuple[int, int]) -> Version | None:
    text = COMPUTE_CAPABILITY_MIN_CUDA.get(capability)
    return parse_cuda_version(text) if text is not None else None


def min_driver_for_compute_capability(capability: tuple[int, int]) -> Version | None:
    """Derived rule: the Table 3 driver of the first toolkit that supports the GPU.

    NVIDIA states GPU support per driver in each driver's README ("Supported
    NVIDIA GPU Products"); that list is not reproduced here. A driver released
    before the first CUDA toolkit that knows an architecture cannot know that
    architecture's GPUs either, so this floor refuses what is certainly broken
    (driver 470 on an RTX 4090) without claiming every newer driver works.
    """
    cuda = min_cuda_for_compute_capability(capability)
    return min_driver_for_cuda(cuda) if cuda is not None else None


def max_compute_capability_for_driver(driver: Version) -> tuple[int, int] | None:
    """The newest compute capability a driver reaches by the derived rule above.

    Driver 470.x gives 8.6 (Ampere): sm_89 and sm_90 arrived with CUDA 11.8 and
    its 520.61.05 driver, so 470 cannot drive an RTX 4090, L40S or H100.
    """
    reachable = [
        capability
        for capability in COMPUTE_CAPABILITY_MIN_CUDA
        if (floor := min_driver_for_compute_capability(capability)) is not None and driver >= floor
    ]
    return max(reachable) if reachable else None


def _normalise_gpu_name(name: str) -> list[str]:
    words = re.split(r"[\s\-_/]+", name.strip().upper())
    return [word for word in words if word and word not in _DROPPED_NAME_WORDS]


def gpu_compute_capability(name: str) -> tuple[int, int]:
    """The compute capability of a GPU named as in nvidia-smi or marketing ("RTX 4090")."""
    words = _normalise_gpu_name(name)
    best: tuple[int, tuple[int, int]] | None = None
    for key, capability in GPU_COMPUTE_CAPABILITY.items():
        key_words = key.split()
        if words[: len(key_words)] == key_words and (best is None or len(key_words) > best[0]):
            best = (len(key_words), capability)
    if best is None:
        known = ", ".join(sorted(GPU_COMPUTE_CAPABILITY))
        raise ValueError(
            f"unknown GPU {name!r}; give its compute capability instead "
            f"(nvidia-smi --query-gpu=compute_cap --format=csv) or one of: {known}"
        )
    return best[1]


def _gpu_examples(capability: tuple[int, int]) -> str:
    names = [name for name, cap in GPU_COMPUTE_CAPABILITY.items() if cap == capability][:2]
    return f" ({', '.join(names)})" if names else ""
