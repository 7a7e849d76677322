"""Gemma 3 (text): Gemma 2's decoder with an RMSNorm over each head of q and k, five sliding-window
layers to each global one, and a rope per layer type (the local layers' own base frequency)."""
from __future__ import annotations

from engine.models.decoder import (DecoderFeatures, DecoderForCausalLM, activation_name, head_dim_of,
                                   layer_windows)
from engine.models.rope import rope_spec


class Gemma3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("Gemma 3 with use_bidirectional_attention=True (an encoder) is not supported")
        bias = bool(getattr(config, "attention_bias", False))
        layer_types = tuple(config.layer_types)
        ropes = {t: rope_spec(config, head_dim_of(config), t) for t in sorted(set(layer_types))}
        return DecoderFeatures(
            sliding_windows=layer_windows(config), rope_keys=layer_types, ropes=ropes,
            qkv_bias=bias, o_bias=bias, qk_norm=True, sandwich_norms=True,
            norm_weight_offset=1.0, activation=activation_name(config, "hidden_activation"),
            embedding_scale=config.hidden_size ** 0.5, attention_scale=config.query_pre_attn_scalar ** -0.5,
            attn_logit_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
            final_logit_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0))
