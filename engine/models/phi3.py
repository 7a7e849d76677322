"""Phi-3 / Phi-4-mini: checkpoints with q/k/v and gate/up already fused (`qkv_proj`, `gate_up_proj`,
loaded as they are), longrope ("su") scaling, partial rotary (Phi-4-mini rotates 3/4 of each head),
and a sliding window on every layer when the config sets one."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, every_layer_window, single_rope


class Phi3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        rope_keys, ropes = single_rope(config)
        return DecoderFeatures(sliding_windows=every_layer_window(config), rope_keys=rope_keys, ropes=ropes,
                               activation=activation_name(config))
