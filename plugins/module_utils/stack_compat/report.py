"""What a check reports: one Problem per broken rule, with the rule's stable id and its source."""

from __future__ import annotations

from dataclasses import dataclass

from .tables import CUDA_GPUS, CUDA_RELEASE_NOTES, PYTORCH_CPP_EXTENSION, PYTORCH_RELEASE_MATRIX, VLLM_RELEASES

# Stable rule ids and where each rule comes from. Problem.source repeats the URL.
RULES: dict[str, str] = {
    "unknown-cuda-version": CUDA_RELEASE_NOTES,
    "driver-too-old-for-cuda": CUDA_RELEASE_NOTES,
    "unknown-torch-version": PYTORCH_RELEASE_MATRIX,
    "torch-not-cuda-build": PYTORCH_RELEASE_MATRIX,
    "torch-cuda-tag-unpublished": PYTORCH_RELEASE_MATRIX,
    "driver-too-old-for-torch": CUDA_RELEASE_NOTES,
    "torch-cuda-major-mismatch": PYTORCH_CPP_EXTENSION,
    "unknown-vllm-version": VLLM_RELEASES,
    "vllm-torch-mismatch": VLLM_RELEASES,
    "vllm-transformers-mismatch": VLLM_RELEASES,
    "unknown-compute-capability": CUDA_GPUS,
    "cuda-too-old-for-gpu": "https://docs.nvidia.com/cuda/ada-compatibility-guide/",
    "torch-cuda-too-old-for-gpu": "https://docs.nvidia.com/cuda/ada-compatibility-guide/",
    "cuda-dropped-gpu": CUDA_RELEASE_NOTES,
    "driver-too-old-for-gpu": CUDA_RELEASE_NOTES,
    "stack-driver-branch-mismatch": CUDA_RELEASE_NOTES,
    "stack-cuda-package-mismatch": CUDA_RELEASE_NOTES,
    "stack-torch-cuda-tag-mismatch": PYTORCH_RELEASE_MATRIX,
    "stack-image-tag-mismatch": VLLM_RELEASES,
}


@dataclass(frozen=True)
class Problem:
    """One broken rule: what was found, what is required, and what to do."""

    rule: str
    found: str
    required: str
    message: str

    @property
    def source(self) -> str:
        return RULES[self.rule]

    def as_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "message": self.message,
            "found": self.found,
            "required": self.required,
            "source": self.source,
        }

    def line(self) -> str:
        """One line for a terminal: the rule, the message, found and required."""
        return f"[{self.rule}] {self.message} (found {self.found}; required {self.required})"
