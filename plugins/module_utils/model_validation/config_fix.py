"""Explicit config.json fixes (`--fix-config KEY=VALUE`, the module's config_fixes): planned, shown as a
diff, written with a backup."""

from __future__ import annotations

import datetime
import difflib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .findings import CONFIG, _join


def parse_fix(text: str) -> tuple[str, Any]:
    """KEY=VALUE -> (key, value); VALUE is JSON when it parses (1000000.0, true, null), else a string."""
    key, separator, raw = text.partition("=")
    key = key.strip()
    if not separator or not key:
        raise ValueError(f"config fix {text!r} must be KEY=VALUE, e.g. rope_theta=1000000.0")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def _render_config(original_text: str, config: dict[str, Any]) -> str:
    """config as JSON, in the original's key order and indentation style where it can tell."""
    original = json.loads(original_text)
    sorted_style = original_text == json.dumps(original, indent=2, sort_keys=True) + "\n"
    return json.dumps(config, indent=2, sort_keys=sorted_style, ensure_ascii=False) + "\n"


@dataclass
class ConfigFix:
    """What an explicit config fix changes (or would change, in check mode)."""

    path: str
    keys: list[str]
    before: str
    after: str
    written: bool = False
    backup_file: str | None = None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def unified_diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                fromfile=f"{self.path} (before)",
                tofile=f"{self.path} (after)",
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "keys": self.keys,
            "changed": self.changed,
            "written": self.written,
            "backup_file": self.backup_file,
            "diff": self.unified_diff(),
            "before": self.before,
            "after": self.after,
        }


def plan_config_fixes(model_dir: str, fixes: dict[str, Any]) -> ConfigFix:
    """The config.json text before and after setting each key of fixes (nothing is written)."""
    path = _join(model_dir, CONFIG)
    try:
        before = Path(path).read_text(encoding="utf-8")
        config = json.loads(before)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot apply config fixes: {path} cannot be read as JSON ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"cannot apply config fixes: {path} is not a JSON object")
    changed_keys = []
    for key, value in fixes.items():
        if key not in config or config[key] != value or type(config[key]) is not type(value):
            config[key] = value
            changed_keys.append(key)
    after = _render_config(before, config) if changed_keys else before
    return ConfigFix(path=path, keys=changed_keys, before=before, after=after)


def backup_name(path: str, now: datetime.datetime | None = None) -> str:
    """config.json.orig-20261130T101500Z, with -1, -2, ... if that name is taken."""
    # datetime.UTC is 3.11+; managed hosts may run an older Python.
    utc = datetime.timezone.utc  # noqa: UP017
    stamp = (now or datetime.datetime.now(utc)).strftime("%Y%m%dT%H%M%SZ")
    candidate = f"{path}.orig-{stamp}"
    counter = 0
    while Path(candidate).exists():
        counter += 1
        candidate = f"{path}.orig-{stamp}-{counter}"
    return candidate


def write_config_fix(fix: ConfigFix, backup: bool = True) -> ConfigFix:
    """Back up config.json (unless told not to) and replace it atomically with fix.after."""
    if not fix.changed:
        return fix
    if backup:
        fix.backup_file = backup_name(fix.path)
        shutil.copy2(fix.path, fix.backup_file)
    partial = Path(fix.path).with_name(f".{CONFIG}.partial")
    partial.write_text(fix.after, encoding="utf-8")
    shutil.copymode(fix.path, partial)
    partial.replace(fix.path)
    fix.written = True
    return fix
