"""Tiny random models of every supported family, saved as Hugging Face folders with the default
model's tokenizer (tests/engine/test_model_families.py).

Each config is small (3-4 layers, hidden 64, GQA 4/2) with the family's special features switched
on; the weights are transformers' own initialisation, spread out (initializer_range 0.2: greedy
choices have clear margins) and with every 1-D weight (norms, biases) moved off its default, so a
norm or bias that is read wrongly changes the logits.
"""
from __future__ import annotations

import shutil
from pathlib import Path

VOCAB = 49152  # the default tokenizer's
WINDOW = 24  # sliding window of the families that have one: shorter than the test prompts
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
               initializer_range=0.2, rms_norm_eps=1e-6)


def family_config(family: str):
    """The transformers config of one test family."""
    import transformers as t

    if family == "llama3":  # llama3 rope, untied head
        return t.LlamaConfig(**_COMMON, head_dim=16, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "llama2-linear":  # linear scaling, tied embeddings, q/k/v/o biases
        return t.LlamaConfig(**_COMMON, head_dim=16, tie_word_embeddings=True, attention_bias=True,
                             rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    if family == "mistral":
        return t.MistralConfig(**_COMMON, head_dim=16, sliding_window=WINDOW, tie_word_embeddings=False)
    if family == "qwen2":  # q/k/v biases; sliding window on the layers from max_window_layers
        return t.Qwen2Config(**_COMMON, tie_word_embeddings=True, use_sliding_window=True, sliding_window=WINDOW,
                             max_window_layers=1)
    if family == "qwen3":
        return t.Qwen3Config(**_COMMON, head_dim=16, tie_word_embeddings=True)
    if family == "gemma2":  # soft caps low enough to bite
        return t.Gemma2Config(**_COMMON, head_dim=16, query_pre_attn_scalar=32, sliding_window=WINDOW,
                              attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                              hidden_activation="gelu_pytorch_tanh")
    if family == "gemma3":  # sliding/global layers with their own ropes (linear scaling on the global ones)
        common = {**_COMMON, "num_hidden_layers": 4}
        return t.Gemma3TextConfig(
            **common, head_dim=16, query_pre_attn_scalar=32, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            final_logit_softcapping=5.0, architectures=["Gemma3ForCausalLM"])
    if family == "phi3":  # longrope with its attention scale, partial rotary (half of each head)
        rotary_half = 4  # (16 * 0.5) / 2 frequencies
        return t.Phi3Config(**_COMMON, original_max_position_embeddings=256, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5,
                                             "short_factor": [1.0, 1.3, 1.9, 2.6][:rotary_half],
                                             "long_factor": [1.5, 2.5, 4.0, 8.0][:rotary_half]})
    raise ValueError(family)


FAMILIES = ("llama3", "llama2-linear", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
WINDOWED = {"mistral", "qwen2", "gemma2", "gemma3"}


def save_family(family: str, out: Path, tokenizer_dir: Path):
    """A random model of `family` in float32, saved to `out` with the default tokenizer; returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    config = family_config(family)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    return model
