"""Qwen3 (dense): Llama's decoder with an RMSNorm over each head of q and k before the rotary,
and no q/k/v biases unless `attention_bias` says so."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, layer_windows, single_rope


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        rope_keys, ropes = single_rope(config)
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderFeatures(sliding_windows=layer_windows(config), rope_keys=rope_keys, ropes=ropes,
                               qkv_bias=bias, o_bias=bias, qk_norm=True,
                               activation=activation_name(config))
