"""The architectures the double accepts: a fixed subset of real vLLM's registry names."""

_SUPPORTED_ARCHS = (
    "DeepseekV3ForCausalLM",
    "Gemma3ForCausalLM",
    "Glm4MoeForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)


class _ModelRegistry:
    """Mirrors the one call of vllm.ModelRegistry that deployment checks use."""

    def get_supported_archs(self) -> list:
        return list(_SUPPORTED_ARCHS)


ModelRegistry = _ModelRegistry()
