"""Qwen2 / Qwen2.5: Llama's decoder with biases on q, k and v. Sliding windows only where the
config turns them on (`use_sliding_window`, layers from `max_window_layers`: transformers' `layer_types`)."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, layer_windows, single_rope


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        rope_keys, ropes = single_rope(config)
        return DecoderFeatures(sliding_windows=layer_windows(config), rope_keys=rope_keys, ropes=ropes,
                               qkv_bias=True, activation=activation_name(config))
