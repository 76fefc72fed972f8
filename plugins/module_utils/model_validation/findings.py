"""What a check reports (problems with their fix, warnings), the file names it looks for, and
reading those files into it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_WEIGHTS_BIN = "adapter_model.bin"
_SHARD_RE = re.compile(r"^model-\d+-of-\d+\.safetensors$")


@dataclass(frozen=True)
class Problem:
    """One reason the directory is not servable: the file, what is wrong, what to do."""

    code: str
    file: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "file": self.file, "message": self.message, "fix": self.fix}

    def line(self) -> str:
        return f"{self.file}: {self.message}; fix: {self.fix}"


@dataclass
class _Findings:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, code: str, file: str, message: str, fix: str) -> None:
        self.problems.append(Problem(code, file, message, fix))


def _join(directory: str, name: str) -> str:
    return str(Path(directory) / name)


def _is_file(path: str) -> bool:
    return Path(path).is_file()


def _read_json(path: str, findings: _Findings, code: str, fix: str) -> Any:
    """The parsed JSON of path, or None after recording why it could not be read."""
    try:
        with Path(path).open(encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        findings.problem(code, path, "is missing", fix)
    except OSError as error:
        findings.problem(code, path, f"cannot be read ({error.strerror})", "fix its permissions or copy it again")
    except ValueError as error:
        findings.problem(code, path, f"is not valid JSON ({error})", fix)
    return None
