"""Mistral: Llama's decoder with sliding-window attention on every layer when the config sets
`sliding_window` (Mistral 7B v0.1: 4096; later versions: none)."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, every_layer_window, single_rope


class MistralForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        rope_keys, ropes = single_rope(config)
        return DecoderFeatures(sliding_windows=every_layer_window(config), rope_keys=rope_keys, ropes=ropes,
                               activation=activation_name(config))
