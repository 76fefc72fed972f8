"""LoRA both ways, for real: adapters served by vLLM-CPU, and an adapter merged with the toolchain.

Served: the tiny model with two tiny adapters, with --enable-lora, --lora-modules,
--max-loras and --max-lora-rank derived from the adapters by model_check (the
facts the vllm role uses) and rendered by engine_args.render_args (the role's
vllm_args filter): vLLM accepts them, lists the adapters and answers with them.

Merged: the lab toolchain (torch, transformers, PEFT from the lab's wheelhouse,
pip --no-index) merges one adapter into a new directory; the check passes, the
targeted weights (and only they) changed, and vLLM serving the merged model
answers greedily exactly what the base answers with the adapter applied.

One engine runs at a time (two cores): the LoRA server is stopped before the
merged model's server starts, so the tests run in file order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from llmfleet.build import toolchain
from llmfleet.lab import vllm_cpu
from llmfleet.lab.tiny import read_safetensors_header
from llmfleet.lab.tiny_adapter import make_tiny_adapter
from llmfleet.module_utils import engine_args, model_validation
from llmfleet.paths import REPO_ROOT
from tests.tools import free_loopback_port

VERSION = model_validation.LAB_ENGINE_VERSION
TIMEOUT_S = 60
# name -> (seed, targets, rank). Rank 12 is not a --max-lora-rank value: the
# derived flag must round it up to 16, the smallest one vLLM accepts above it.
ADAPTERS = {
    "qv-r8": (1, ("q_proj", "v_proj"), 8),
    "attn-r12": (2, ("q_proj", "k_proj", "v_proj", "o_proj"), 12),
}
MERGED_ADAPTER = "qv-r8"
PROMPTS = ("The quick brown fox", "Operators deploy inference servers", "Hello, world!")
MAX_TOKENS = 16
# Merged vs LoRA log-probabilities: bf16 rounding differs (measured max 0.0078).
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # loopback only, whatever the proxy settings say
        yield session


def _complete(http: requests.Session, url: str, model: str, prompt: str) -> dict[str, Any]:
    response = http.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1},
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_tiny_adapter(root / name, tiny_model, seed=seed, targets=targets, rank=rank).path
        for name, (seed, targets, rank) in ADAPTERS.items()
    }


@pytest.fixture(scope="module")
def lora_report(tiny_model: Path, adapters: dict[str, Path]) -> dict[str, Any]:
    """model_check of the base with its adapters: what the vllm role's preflight runs."""
    return model_validation.check_model(
        str(tiny_model), adapters=[str(path) for path in adapters.values()], engine_version=VERSION
    )


@pytest.fixture(scope="module")
def lora_argv(lora_report: dict[str, Any], adapters: dict[str, Path]) -> list[str]:
    """The LoRA flags as roles/vllm/tasks/preflight.yml builds them, rendered and checked by engine_args."""
    facts = lora_report["facts"]
    options = {
        "enable_lora": True,
        "lora_modules": [f"{name}={path}" for name, path in adapters.items()],
        "max_loras": facts["max_loras"],
        "max_lora_rank": facts["max_lora_rank"],
    }
    return engine_args.render_args(options, engine_args.load_flags(VERSION))


@pytest.fixture(scope="module")
def lora_server(
    tiny_model: Path, lora_argv: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[vllm_cpu.VllmServer]:
    server = vllm_cpu.start_server(
        tiny_model,
        port=free_loopback_port(),
        kv_cache_gib=1,
        log_path=tmp_path_factory.mktemp("vllm-lora") / "server.log",
        venv=vllm_cpu.ensure_venv(),
        served_model_name="tiny",
        extra_args=lora_argv,
    )
    try:
        yield server
    finally:
        server.stop()


def test_lora_flags_are_derived_from_the_adapters(
    lora_report: dict[str, Any], lora_argv: list[str], adapters: dict[str, Path]
) -> None:
    assert lora_report["problems"] == []
    assert [adapter["max_lora_rank"] for adapter in lora_report["adapters"]] == [8, 16]
    assert lora_argv == [
        "--enable-lora",
        "--lora-modules", f"qv-r8={adapters['qv-r8']}", f"attn-r12={adapters['attn-r12']}",
        "--max-loras", "2",
        "--max-lora-rank", "16",
    ]  # fmt: skip


@pytest.mark.vllm
def test_models_lists_each_adapter_on_its_base(http: requests.Session, lora_server: vllm_cpu.VllmServer) -> None:
    response = http.get(f"{lora_server.url}/v1/models", timeout=TIMEOUT_S)
    assert response.status_code == 200
    models = {model["id"]: model for model in response.json()["data"]}
    assert set(models) == {"tiny", *ADAPTERS}
    for name in ADAPTERS:
        assert models[name]["parent"] == "tiny"


@pytest.mark.vllm
def test_each_adapter_answers_and_changes_the_output(http: requests.Session, lora_server: vllm_cpu.VllmServer) -> None:
    base = _complete(http, lora_server.url, "tiny", PROMPTS[0])
    for name in ADAPTERS:
        answer = _complete(http, lora_server.url, name, PROMPTS[0])
        assert len(answer["logprobs"]["tokens"]) == MAX_TOKENS
        # Applied, not ignored: the adapter moves the first token's log-probability.
        assert answer["logprobs"]["token_logprobs"][0] != base["logprobs"]["token_logprobs"][0]


def test_an_adapter_above_the_engines_max_rank_is_refused_before_start(tiny_model: Path, tmp_path: Path) -> None:
    """r=1024 has no --max-lora-rank (vLLM 0.32.0 stops at 512): the check refuses it; nothing starts."""
    big = make_tiny_adapter(tmp_path / "r1024", tiny_model, seed=3, rank=1024).path
    report = model_validation.check_model(str(tiny_model), adapters=[str(big)], engine_version=VERSION)
    assert [problem["code"] for problem in report["problems"]] == ["rank-too-big"]
    assert report["facts"]["max_lora_rank"] is None
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "model", "check", str(tiny_model), "--adapter", str(big)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "rank 1024 exceeds vLLM 0.32.0's maximum LoRA rank 512" in result.stderr
    # The ranks the check derives from are the engine's own choices (its flag list, read from vLLM).
    flags = engine_args.load_flags(VERSION)
    (option,) = [option for option in flags["options"] if "--max-lora-rank" in option["names"]]
    assert tuple(option["choices"]) == model_validation.LORA_RANKS[VERSION]
    with pytest.raises(engine_args.EngineArgsError, match="--max-lora-rank '1024' is not one of"):
        engine_args.render_args({"max_lora_rank": 1024}, flags)


# --- merged --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_answers(http: requests.Session, lora_server: vllm_cpu.VllmServer) -> dict[str, dict[str, Any]]:
    """Greedy answers of the base with the adapter that gets merged, served through --enable-lora,
    and of the base alone (under "base:" + prompt), recorded before that server stops."""
    answers = {prompt: _complete(http, lora_server.url, MERGED_ADAPTER, prompt) for prompt in PROMPTS}
    answers.update({f"base:{prompt}": _complete(http, lora_server.url, "tiny", prompt) for prompt in PROMPTS})
    return answers


@pytest.fixture(scope="module")
def merged_model(tiny_model: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`llmfleet model merge-adapter` with the lab toolchain venv, built from its wheelhouse."""
    python = toolchain.ensure_venv() / "bin" / "python"
    out = tmp_path_factory.mktemp("merged") / "tiny-qv-r8"
    result = subprocess.run(
        [
            sys.executable, "-m", "llmfleet", "model", "merge-adapter",
            "--base", str(tiny_model), "--adapter", str(adapters[MERGED_ADAPTER]),
            "--out", str(out), "--python", str(python),
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"ok: {out} is servable by vLLM {VERSION}" in result.stdout
    return out


@pytest.fixture(scope="module")
def merged_server(
    merged_model: Path,
    lora_answers: dict[str, dict[str, Any]],
    lora_server: vllm_cpu.VllmServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[vllm_cpu.VllmServer]:
    lora_server.stop()  # its answers are recorded; one engine at a time on two cores
    server = vllm_cpu.start_server(
        merged_model,
        port=free_loopback_port(),
        kv_cache_gib=1,
        log_path=tmp_path_factory.mktemp("vllm-merged") / "server.log",
        venv=vllm_cpu.ensure_venv(),
        served_model_name="tiny-merged",
    )
    try:
        yield server
    finally:
        server.stop()


def test_merge_refuses_an_existing_directory(merged_model: Path, tiny_model: Path, adapters: dict[str, Path]) -> None:
    before = {path.name: path.stat().st_mtime_ns for path in merged_model.iterdir()}
    result = subprocess.run(
        [
            sys.executable, "-m", "llmfleet", "model", "merge-adapter",
            "--base", str(tiny_model), "--adapter", str(adapters[MERGED_ADAPTER]),
            "--out", str(merged_model), "--python", str(toolchain.ensure_venv() / "bin" / "python"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "exists and is not an empty directory" in result.stderr
    assert {path.name: path.stat().st_mtime_ns for path in merged_model.iterdir()} == before
    assert not list(merged_model.parent.glob(".*merge-*")), "a temporary merge directory was left behind"


def test_merged_model_checks_as_a_plain_model(merged_model: Path, tiny_model: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "model", "check", str(merged_model), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == []
    assert report["adapters"] == []
    assert "max_lora_rank" not in report["facts"]
    assert not (merged_model / model_validation.ADAPTER_CONFIG).exists()
    # Tokenizer and chat template come from the base, byte for byte.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (merged_model / name).read_bytes() == (tiny_model / name).read_bytes()
    assert "chat_template" in json.loads((merged_model / "tokenizer_config.json").read_text())


def _bf16_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a bf16 safetensors file as float32 (exact: bf16 is float32's upper half)."""
    header = read_safetensors_header(path)
    data = path.read_bytes()[8 + int.from_bytes(path.read_bytes()[:8], "little") :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", name
        begin, end = info["data_offsets"]
        bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
        tensors[name] = bits.view(np.float32).reshape(info["shape"])
    return tensors


def test_merge_changes_exactly_the_targeted_weights(
    merged_model: Path, tiny_model: Path, adapters: dict[str, Path]
) -> None:
    base = _bf16_tensors(tiny_model / "model.safetensors")
    merged = _bf16_tensors(merged_model / "model.safetensors")
    lora = _bf16_tensors(adapters[MERGED_ADAPTER] / "adapter_model.safetensors")
    config = json.loads((adapters[MERGED_ADAPTER] / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    assert set(merged) == set(base)
    changed = sorted(name for name in base if not np.array_equal(base[name], merged[name]))
    assert changed == [
        f"model.layers.{layer}.self_attn.{module}.weight" for layer in range(2) for module in ("q_proj", "v_proj")
    ]
    for name in changed:
        prefix = f"base_model.model.{name.removesuffix('.weight')}"
        delta = scale * (lora[f"{prefix}.lora_B.weight"] @ lora[f"{prefix}.lora_A.weight"])
        expected = base[name] + delta
        # One bf16 rounding of W + scale * B @ A: within half a bf16 step (2**-8 relative) of the exact sum.
        error = np.abs(merged[name] - expected)
        assert np.all(error <= np.abs(expected) * 2.0**-8 + 1e-12), (name, float(error.max()))


@pytest.mark.vllm
def test_merged_model_answers_like_the_base_with_the_adapter(
    http: requests.Session, merged_server: vllm_cpu.VllmServer, lora_answers: dict[str, dict[str, Any]]
) -> None:
    """Same greedy tokens and text; log-probabilities differ only by bf16 rounding.

    Served with --enable-lora, vLLM adds (x A^T) B^T scale to x W^T in bf16 at run
    time; the merged model rounds W + scale B A to bf16 once. Measured on this
    machine (identical on every run): 48 of 48 tokens equal, max |delta logprob|
    0.0078; merged vs base, first token of each prompt: 0.0059, 0.0544, 0.0090.
    The test prints these numbers.
    """
    differences, adapter_effect = [], []
    for prompt in PROMPTS:
        lora, base = lora_answers[prompt], lora_answers[f"base:{prompt}"]
        merged = _complete(http, merged_server.url, "tiny-merged", prompt)
        assert merged["logprobs"]["tokens"] == lora["logprobs"]["tokens"], prompt
        assert merged["text"] == lora["text"], prompt
        differences += [
            abs(a - b)
            for a, b in zip(merged["logprobs"]["token_logprobs"], lora["logprobs"]["token_logprobs"], strict=True)
        ]
        adapter_effect.append(abs(merged["logprobs"]["token_logprobs"][0] - base["logprobs"]["token_logprobs"][0]))
    print(
        f"merged vs LoRA: {len(differences)} tokens equal, max |delta logprob| {max(differences):.5f};"
        f" merged vs base, first token: |delta logprob| {', '.join(f'{d:.5f}' for d in adapter_effect)}"
    )
    assert max(differences) < TOLERANCE
    # The tolerance is tight enough to tell the adapter from the base: merged (like
    # LoRA) moves at least one answer's first log-probability by more than it.
    assert all(effect > 0 for effect in adapter_effect)
    assert max(adapter_effect) > TOLERANCE


def test_merge_playbook_merges_once_and_checks_the_result(
    tiny_model: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """playbooks/merge_adapter.yml on this machine (connection local): check mode, a merge, a no-op rerun."""
    out = tmp_path / "merged-by-playbook"
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i", "localhost,", "-c", "local", str(REPO_ROOT / "playbooks" / "merge_adapter.yml"),
        "-e", "merge_adapter_hosts=localhost",
        "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", f"merge_adapter_python={toolchain.ensure_venv() / 'bin' / 'python'}",
        "-e", f"merge_adapter_engine_version={VERSION}",
        "-e", f"merge_adapter_base={tiny_model}",
        "-e", f"merge_adapter_lora={adapters[MERGED_ADAPTER]}",
        "-e", f"merge_adapter_out={out}",
    ]  # fmt: skip

    def play(*extra: str) -> str:
        result = subprocess.run([*command, *extra], capture_output=True, text=True, check=False, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        return result.stdout

    checked = play("--check")
    assert "changed=0" in checked and "Would merge" in checked
    assert not out.exists()
    assert "changed=1" in play()
    assert (out / "llmfleet-merge.json").is_file() and not (out / model_validation.ADAPTER_CONFIG).exists()
    again = play()
    assert "changed=0" in again and "(merged earlier)" in again
