"""Gemma 2: GeGLU, RMSNorm weights stored as w - 1, norms after attention and around the MLP,
embeddings scaled by sqrt(hidden_size), scores scaled by query_pre_attn_scalar ** -0.5 and
soft-capped, final logits soft-capped, sliding-window and global layers alternating."""
from __future__ import annotations

from engine.models.decoder import DecoderFeatures, DecoderForCausalLM, activation_name, layer_windows, single_rope


class Gemma2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def features(cls, config) -> DecoderFeatures:
        rope_keys, ropes = single_rope(config)
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderFeatures(
            sliding_windows=layer_windows(config), rope_keys=rope_keys, ropes=ropes,
            qkv_bias=bias, o_bias=bias, sandwich_norms=True, norm_weight_offset=1.0,
            activation=activation_name(config, "hidden_activation"), embedding_scale=config.hidden_size ** 0.5,
            attention_scale=config.query_pre_attn_scalar ** -0.5,
            attn_logit_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
            final_logit_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0))
