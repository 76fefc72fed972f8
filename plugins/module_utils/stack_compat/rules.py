"""The rules: which driver, CUDA, PyTorch, vLLM, transformers and GPU go together."""

from __future__ import annotations

from .report import Problem
from .tables import (
    COMPUTE_CAPABILITY_MIN_CUDA,
    LAST_CUDA_MAJOR_BELOW_7_5,
    TORCH_CUDA_TAGS,
    VLLM_TORCH,
    VLLM_TRANSFORMERS,
    _gpu_examples,
    max_compute_capability_for_driver,
    min_cuda_for_compute_capability,
    min_driver_for_compute_capability,
    min_driver_for_cuda,
)
from .versions import (
    Version,
    cuda_tag,
    cuda_tag_version,
    format_compute_capability,
    parse_compute_capability,
    parse_cuda_version,
    parse_driver_version,
    parse_torch_version,
    parse_transformers_version,
    parse_vllm_version,
)


def check(
    driver: str,
    cuda: str,
    torch: str | None = None,
    vllm: str | None = None,
    compute_capability: str | None = None,
    transformers: str | None = None,
) -> list[Problem]:
    """Every rule the given versions break; an empty list means compatible.

    Raises ValueError (with a message that says what was expected) for input
    that is not a version at all, before any rule is applied.
    """
    driver_v = parse_driver_version(driver)
    cuda_v = parse_cuda_version(cuda)
    torch_v = parse_torch_version(torch) if torch is not None else None
    vllm_v = parse_vllm_version(vllm) if vllm is not None else None
    transformers_v = parse_transformers_version(transformers) if transformers is not None else None
    capability = parse_compute_capability(compute_capability) if compute_capability is not None else None

    problems: list[Problem] = []
    problems += _check_driver_cuda(driver_v, cuda_v)
    torch_cuda: Version | None = None
    if torch_v is not None:
        torch_problems, torch_cuda = _check_torch(driver_v, cuda_v, torch_v)
        problems += torch_problems
    if vllm_v is not None:
        problems += _check_vllm(vllm_v, torch_v)
        if transformers_v is not None:
            problems += _check_vllm_transformers(vllm_v, transformers_v)
    if capability is not None:
        problems += _check_gpu(driver_v, cuda_v, torch_cuda, capability)
    return problems


def _check_driver_cuda(driver: Version, cuda: Version) -> list[Problem]:
    floor = min_driver_for_cuda(cuda)
    if floor is None:
        return [
            Problem(
                "unknown-cuda-version",
                found=f"CUDA {cuda}",
                required="a CUDA release listed in the release notes' Table 3",
                message=(
                    f"CUDA {cuda} is not in the driver table; check the version, or add its row from the "
                    "CUDA release notes (Table 3) to CUDA_TOOLKIT_MIN_DRIVER"
                ),
            )
        ]
    if driver < floor:
        return [
            Problem(
                "driver-too-old-for-cuda",
                found=f"driver {driver}",
                required=f">= {floor}",
                message=(
                    f"NVIDIA driver {driver} is older than {floor}, the minimum Linux driver for CUDA {cuda} "
                    f"(CUDA release notes, Table 3); install driver >= {floor} (branch {floor.major} or newer, "
                    "e.g. an LTS branch) or pin an older CUDA"
                ),
            )
        ]
    return []


def _check_torch(driver: Version, cuda: Version, torch: Version) -> tuple[list[Problem], Version | None]:
    tags = TORCH_CUDA_TAGS.get((torch.major, torch.minor))
    if tags is None:
        known = ", ".join(f"{major}.{minor}" for major, minor in sorted(TORCH_CUDA_TAGS))
        return [
            Problem(
                "unknown-torch-version",
                found=f"torch {torch}",
                required=f"one of {known}",
                message=(
                    f"PyTorch {torch.major}.{torch.minor} is not in the table; add its CUDA labels from "
                    "PyTorch's release compatibility matrix to TORCH_CUDA_TAGS"
                ),
            )
        ], None
    if torch.local is None:
        return [], None  # a bare version names no CUDA build; only the vLLM rule applies
    if not torch.local.startswith("cu"):
        return [
            Problem(
                "torch-not-cuda-build",
                found=f"torch {torch}",
                required=f"a CUDA build: {', '.join(tags)}",
                message=(
                    f"torch {torch} is a '{torch.local}' build without CUDA kernels; install "
                    f"torch=={torch.public()}+{cuda_tag(cuda)} (or another of {', '.join(tags)})"
                ),
            )
        ], None
    if torch.local not in tags:
        return [
            Problem(
                "torch-cuda-tag-unpublished",
                found=f"torch {torch}",
                required=f"one of {', '.join(tags)}",
                message=(
                    f"PyTorch {torch.public()} was published for {', '.join(tags)} only; "
                    f"there is no {torch.local} build, pick one of those labels"
                ),
            )
        ], None
    torch_cuda = cuda_tag_version(torch.local)
    problems: list[Problem] = []
    floor = min_driver_for_cuda(torch_cuda)
    if floor is not None and driver < floor:
        problems.append(
            Problem(
                "driver-too-old-for-torch",
                found=f"driver {driver}",
                required=f">= {floor}",
                message=(
                    f"torch {torch} carries the CUDA {torch_cuda} runtime, which needs driver >= {floor} "
                    f"(CUDA release notes, Table 3); driver {driver} cannot run it: upgrade the driver or "
                    "install a torch build for an older CUDA"
                ),
            )
        )
    if torch_cuda.major != cuda.major:
        problems.append(
            Problem(
                "torch-cuda-major-mismatch",
                found=f"torch {torch} with CUDA toolkit {cuda}",
                required=f"a cu{cuda.major}x build of torch (or CUDA {torch_cuda.major}.x)",
                message=(
                    f"torch {torch} was built with CUDA {torch_cuda} but the toolkit is CUDA {cuda}; "
                    "PyTorch refuses to build CUDA extensions across major versions: install "
                    f"torch=={torch.public()}+{cuda_tag(cuda)} if published, or a CUDA {torch_cuda.major}.x toolkit"
                ),
            )
        )
    return problems, torch_cuda


def _check_vllm(vllm: Version, torch: Version | None) -> list[Problem]:
    wanted = VLLM_TORCH.get(vllm.release)
    if wanted is None:
        known = ", ".join(".".join(str(part) for part in release) for release in sorted(VLLM_TORCH))
        return [
            Problem(
                "unknown-vllm-version",
                found=f"vLLM {vllm}",
                required=f"one of {known}",
                message=(
                    f"vLLM {vllm} is not in the table; add the torch version its package pins "
                    "(Requires-Dist: torch==X) to VLLM_TORCH"
                ),
            )
        ]
    if torch is not None and torch.public() != wanted:
        return [
            Problem(
                "vllm-torch-mismatch",
                found=f"vLLM {vllm} with torch {torch}",
                required=f"torch == {wanted}",
                message=(
                    f"vLLM {vllm} pins torch=={wanted}, not {torch.public()}: its compiled kernels only load "
                    f"against that torch; install torch {wanted} or a vLLM release built for {torch.public()}"
                ),
            )
        ]
    return []


def _check_vllm_transformers(vllm: Version, transformers: Version) -> list[Problem]:
    bounds = VLLM_TRANSFORMERS.get(vllm.release)
    if bounds is None:
        return []  # an unknown vLLM is already refused by _check_vllm
    low = parse_transformers_version(bounds[0])
    high = parse_transformers_version(bounds[1]) if bounds[1] is not None else None
    if low <= transformers and (high is None or transformers < high):
        return []
    required = f">= {low}" + (f", < {high}" if high is not None else "")
    return [
        Problem(
            "vllm-transformers-mismatch",
            found=f"vLLM {vllm} with transformers {transformers}",
            required=f"transformers {required}",
            message=(
                f"vLLM {vllm} requires transformers {required} (its package metadata"
                f"{'; vLLM release page' if high is not None else ''}); transformers {transformers} is outside it: "
                "pick a transformers release in that range"
            ),
        )
    ]


def _check_gpu(
    driver: Version, cuda: Version, torch_cuda: Version | None, capability: tuple[int, int]
) -> list[Problem]:
    cc = format_compute_capability(capability)
    gpus = _gpu_examples(capability)
    min_cuda = min_cuda_for_compute_capability(capability)
    if min_cuda is None:
        known = ", ".join(format_compute_capability(cap) for cap in sorted(COMPUTE_CAPABILITY_MIN_CUDA))
        return [
            Problem(
                "unknown-compute-capability",
                found=f"compute capability {cc}",
                required=f"one of {known}",
                message=(
                    f"compute capability {cc} is not in the table; add the first CUDA toolkit that supports it "
                    "(NVIDIA's architecture compatibility guide) to COMPUTE_CAPABILITY_MIN_CUDA"
                ),
            )
        ]
    problems: list[Problem] = []
    if cuda < min_cuda:
        problems.append(
            Problem(
                "cuda-too-old-for-gpu",
                found=f"CUDA {cuda}",
                required=f">= {min_cuda}",
                message=(
                    f"compute capability {cc}{gpus} needs CUDA >= {min_cuda}; CUDA {cuda} cannot build kernels "
                    'for it ("no kernel image is available"): pin a newer CUDA'
                ),
            )
        )
    if torch_cuda is not None and torch_cuda < min_cuda:
        problems.append(
            Problem(
                "torch-cuda-too-old-for-gpu",
                found=f"torch built with CUDA {torch_cuda}",
                required=f"a torch build for CUDA >= {min_cuda}",
                message=(
                    f"compute capability {cc}{gpus} needs CUDA >= {min_cuda}, but torch was built with CUDA "
                    f"{torch_cuda} and has no kernels for it: install a torch build for CUDA >= {min_cuda}"
                ),
            )
        )
    if capability < (7, 5):
        for label, version in (("CUDA", cuda), ("torch's CUDA", torch_cuda)):
            if version is not None and version.major > LAST_CUDA_MAJOR_BELOW_7_5:
                problems.append(
                    Problem(
                        "cuda-dropped-gpu",
                        found=f"{label} {version}",
                        required=f"CUDA {LAST_CUDA_MAJOR_BELOW_7_5}.x",
                        message=(
                            f"CUDA 13.0 removed support for compute capability below 7.5; {label} {version} "
                            f"cannot target {cc}{gpus}: stay on CUDA {LAST_CUDA_MAJOR_BELOW_7_5}.x for this GPU"
                        ),
                    )
                )
    floor = min_driver_for_compute_capability(capability)
    if floor is not None and driver < floor:
        reach = max_compute_capability_for_driver(driver)
        reach_text = (
            f"reaches compute capability {format_compute_capability(reach)} at most"
            if reach
            else ("predates every GPU in the table")
        )
        problems.append(
            Problem(
                "driver-too-old-for-gpu",
                found=f"driver {driver}",
                required=f">= {floor}",
                message=(
                    f"compute capability {cc}{gpus} first appeared with CUDA {min_cuda}, whose driver is "
                    f">= {floor}; driver {driver} {reach_text} and cannot run this GPU: install driver >= {floor}"
                ),
            )
        )
    return problems
