"""The tokenizer files, and a chat template when chat is served."""

from __future__ import annotations

from typing import Any

from .findings import (
    CHAT_TEMPLATE_FILES,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    TOKENIZER_MODEL,
    _Findings,
    _is_file,
    _join,
    _read_json,
)


def _check_tokenizer(model_dir: str, chat: bool, findings: _Findings) -> dict[str, Any]:
    has_json = _is_file(_join(model_dir, TOKENIZER_JSON))
    has_model = _is_file(_join(model_dir, TOKENIZER_MODEL))
    if not has_json and not has_model:
        findings.problem(
            "missing-tokenizer", _join(model_dir, TOKENIZER_JSON),
            f"is missing, and so is {TOKENIZER_MODEL}: vLLM cannot tokenize prompts",
            "copy the tokenizer files (tokenizer.json or tokenizer.model, and tokenizer_config.json)"
            " from the base model or the training output",
        )  # fmt: skip
    tokenizer_config_path = _join(model_dir, TOKENIZER_CONFIG)
    tokenizer_config: Any = None
    if _is_file(tokenizer_config_path):
        tokenizer_config = _read_json(
            tokenizer_config_path, findings, "bad-tokenizer-config", "copy tokenizer_config.json again"
        )
    else:
        findings.problem(
            "missing-tokenizer-config", tokenizer_config_path, "is missing",
            "copy tokenizer_config.json from the base model or the training output",
        )  # fmt: skip
    template = tokenizer_config.get("chat_template") if isinstance(tokenizer_config, dict) else None
    template_file = next((name for name in CHAT_TEMPLATE_FILES if _is_file(_join(model_dir, name))), None)
    has_template = bool(template) or template_file is not None
    if chat and not has_template:
        findings.problem(
            "missing-chat-template", tokenizer_config_path,
            "has no chat_template and there is no chat_template.jinja: /v1/chat/completions would fail",
            "copy chat_template from the base (instruct) model's tokenizer_config.json, add a"
            " chat_template.jinja, or pass the engine --chat-template FILE; if chat is not served,"
            " check with --no-chat (module: chat: false)",
        )  # fmt: skip
    return {
        "tokenizer": TOKENIZER_JSON if has_json else (TOKENIZER_MODEL if has_model else None),
        "chat_template": ("tokenizer_config.json" if template else template_file) if has_template else None,
    }
