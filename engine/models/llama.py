"""Llama 2 / 3.x (and SmolLM2): the plain decoder. Rope: default, linear, dynamic or llama3; embeddings
tied or not; optional q/k/v/o biases (`attention_bias`)."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, single_rope


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        if getattr(config, "mlp_bias", False):
            raise ValueError("Llama with mlp_bias=True is not supported")
        rope_keys, ropes = single_rope(config)
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderFeatures(sliding_windows=(0,) * config.num_hidden_layers, rope_keys=rope_keys, ropes=ropes,
                               qkv_bias=bias, o_bias=bias,
                               activation=activation_name(config))
