"""Validation before queueing: tokens counted with the model's tokenizer, context and max_tokens checks, truncation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmfleet.serve.gateway.validation import (
    ModelInfo,
    check_chat,
    check_completion,
    load_model,
    message_text,
    render_chatml,
)


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> ModelInfo:
    return load_model("tiny", tiny_dir)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_model_info_comes_from_the_model_directory(model: ModelInfo) -> None:
    assert model.config_max_len == 2048
    assert model.max_model_len(0) == 2048  # no engine report: config.json
    assert model.max_model_len(1024) == 1024  # the engine's own figure wins
    assert model.vocab_size > 256


def test_chatml_rendering() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    assert render_chatml(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert message_text(None) == ""


def test_chat_counts_special_tokens_as_one_each(model: ModelInfo) -> None:
    checked = run(check_chat(model, {"messages": [{"role": "user", "content": "Hello"}]}, 8, 2048, 4096, False))
    rendered = render_chatml([{"role": "user", "content": "Hello"}])
    assert checked.prompt_tokens == len(model.tokenizer.encode(rendered, add_special_tokens=False).ids)
    assert model.tokenizer.encode("<|im_start|>", add_special_tokens=False).ids == [1]
    assert checked.max_tokens == 8 and checked.payload["max_tokens"] == 8


def test_an_over_long_prompt_names_both_numbers(model: ModelInfo) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 300
    tokens = len(model.tokenizer.encode(prompt).ids)
    with pytest.raises(APIError) as error:
        run(check_completion(model, {"prompt": prompt}, 16, 2048, 4096, False))
    assert error.value.status == 400 and error.value.code == "context_length_exceeded"
    assert f"the prompt is {tokens} tokens and max_tokens is 16" in error.value.message
    assert "context of 2048 tokens" in error.value.message
    assert error.value.extra == {"prompt_tokens": tokens, "max_tokens": 16, "max_model_len": 2048}


def test_max_tokens_cap_and_default(model: ModelInfo) -> None:
    with pytest.raises(APIError, match="more than this gateway's cap of 100"):
        run(check_completion(model, {"prompt": "hi"}, 101, 2048, 100, False))
    checked = run(check_completion(model, {"prompt": "hi"}, None, 2048, 4096, False))
    assert checked.max_tokens == 2048 - checked.prompt_tokens  # the room left, capped
    checked = run(check_completion(model, {"prompt": "hi"}, None, 2048, 64, False))
    assert checked.max_tokens == 64


def test_truncation_when_the_operator_opts_in(model: ModelInfo) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 300
    ids = model.tokenizer.encode(prompt).ids
    checked = run(check_completion(model, {"prompt": prompt}, 48, 2048, 4096, True))
    assert checked.payload["prompt"] == ids[-2000:]  # the last tokens, sent as token ids
    assert (checked.prompt_tokens, checked.truncated_tokens) == (2000, len(ids) - 2000)

    old = [{"role": "user", "content": "The quick brown fox. " * 200}, {"role": "assistant", "content": "ok"}]
    messages = [{"role": "system", "content": "Be brief."}, *old, {"role": "user", "content": "And now?"}]
    checked = run(check_chat(model, {"messages": messages}, 64, 512, 4096, True))
    assert [m["content"] for m in checked.payload["messages"]] == ["Be brief.", "ok", "And now?"]
    assert checked.prompt_tokens + 64 <= 512 and checked.truncated_tokens > 0
    with pytest.raises(APIError, match=r"do not fit"):
        run(check_chat(model, {"messages": [{"role": "user", "content": "fox " * 600}]}, 64, 512, 4096, True))


def test_token_id_prompts_are_checked_against_the_vocabulary(model: ModelInfo) -> None:
    assert run(check_completion(model, {"prompt": [1, 2, 3]}, 4, 2048, 4096, False)).prompt_tokens == 3
    with pytest.raises(APIError, match="outside the vocabulary"):
        run(check_completion(model, {"prompt": [1, 10**6]}, 4, 2048, 4096, False))


def test_request_bodies_refuse_what_the_engine_should_not_see() -> None:
    ChatCompletionRequest.model_validate({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    bad = [
        {"model": "tiny", "messages": []},
        {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]},
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2},
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": 5}},
        {"model": "tiny", "messages": [{"role": "user", "content": "\ud800"}]},
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")},
    ]
    for body in bad:
        with pytest.raises(ValueError):
            ChatCompletionRequest.model_validate(body)
    request = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert request.requested_max_tokens() == 7
    payload = request.engine_payload()
    assert payload["stream"] is False and "stream_options" not in payload and "max_completion_tokens" not in payload
    assert CompletionRequest.model_validate({"model": "tiny", "prompt": [1, 2]}).prompt == [1, 2]
