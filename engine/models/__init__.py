"""Model families over the attention backends and the CPU kernels: one module per family, all built
from the shared decoder (decoder.py).

`model_class` maps a Hugging Face config's `architectures[0]` to the class that runs it; a new
family adds its module and its names here.
"""
from __future__ import annotations

import importlib

# architecture name (config.json "architectures") -> (module, class)
_REGISTRY = {
    "LlamaForCausalLM": ("engine.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("engine.models.mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("engine.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("engine.models.qwen3", "Qwen3ForCausalLM"),
    "Gemma2ForCausalLM": ("engine.models.gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("engine.models.gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("engine.models.phi3", "Phi3ForCausalLM"),
}
SUPPORTED_ARCHITECTURES = tuple(_REGISTRY)


def model_class(hf_config) -> type:
    """The model class for `hf_config` (a config without `architectures` is taken as Llama);
    ValueError naming the supported ones otherwise."""
    arch = (getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"])[0]
    if arch not in _REGISTRY:
        raise ValueError(f"architecture {arch} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    module, name = _REGISTRY[arch]
    return getattr(importlib.import_module(module), name)
