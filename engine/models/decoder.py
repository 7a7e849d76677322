"""The decoder every supported family is built from, over the paged KV cache.

A family is Llama's decoder with a few switches (`DecoderFeatures`): biases on q/k/v, RMSNorm over
each head of q and k, Gemma's extra norms and (1 + w) norm weights, GeGLU, scaled embeddings,
attention-logit and final-logit soft-capping, a sliding window per layer, a rope per layer type,
partial rotary. Each family module reads its config into those switches; everything else is here:
fused QKV and gate/up projections (packed once for the CPU GEMM), the fused CPU elementwise
ops, attention through an AttentionBackend, and logits only where they are sampled.

transformers supplies the config and the weights and is the reference in tests; the forward is ours
because it reads and writes the paged cache and computes logits only at `logits_indices`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionOptions
from engine.kernels import decoder_ops as ops
from engine.kernels.cpu_linear import PackedEmbedding, PackedLinear, pack_linear, pack_linears
from engine.kernels.int8_linear import quantize_linear, quantize_linears
from engine.kernels.quantized_linear import QuantizedLinear
from engine.models.rope import RopeSpec, RotaryTables, rope_spec
from engine.models.weight_loader import load_safetensors

ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class DecoderFeatures:
    """What sets a family's decoder apart from Llama's. Per-layer tuples have one entry per layer."""

    sliding_windows: tuple[int, ...]  # per layer: 0 = full attention, else keys within the last W positions
    rope_keys: tuple[str, ...]  # per layer: which entry of `ropes` rotates it
    ropes: dict[str, RopeSpec] = field(hash=False)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotary (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # norms after attention and before/after the MLP too (Gemma 2/3)
    norm_weight_offset: float = 0.0  # Gemma stores RMSNorm weights as w - 1: added once at load
    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embedding_scale: float | None = None  # Gemma multiplies the embeddings by sqrt(hidden_size)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcap: float = 0.0  # 0: none, else scores = cap * tanh(scores / cap)
    final_logit_softcap: float = 0.0

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_windows(config) -> tuple[int, ...]:
    """Per layer, the sliding window transformers applies where `layer_types` marks the sliding layers
    (Qwen2/3, Gemma 2/3); a config without `layer_types` has `sliding_window` on every layer."""
    window = int(getattr(config, "sliding_window", None) or 0)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return (window,) * config.num_hidden_layers
    return tuple(window if t == "sliding_attention" else 0 for t in layer_types)


def every_layer_window(config) -> tuple[int, ...]:
    """`sliding_window` on every layer, whatever `layer_types` says: transformers' Mistral and Phi-3
    choose their mask from `sliding_window` alone."""
    return (int(getattr(config, "sliding_window", None) or 0),) * config.num_hidden_layers


def single_rope(config) -> tuple[tuple[str, ...], dict[str, RopeSpec]]:
    """rope_keys and ropes of a config with one rope for all layers."""
    return ("all",) * config.num_hidden_layers, {"all": rope_spec(config, head_dim_of(config))}


def activation_name(config, key: str = "hidden_act") -> str:
    name = getattr(config, key, None) or "silu"
    if name in ("silu", "swish"):
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise ValueError(f"MLP activation {name!r} is not supported; supported: silu, gelu_pytorch_tanh")


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """[n, 2I] (gate, then up) -> act(gate) * up: [n, I]."""
    if activation == "silu":
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def apply_rotary_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_rotated: int,
                  head_dim: int) -> None:
    """Rotates the first num_rotated heads of each row in place over the first cos.shape[-1] channels."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == head_dim:
        ops.rotary_(qkv, cos, sin, num_rotated, head_dim)
        return
    x = qkv[:, :num_rotated * head_dim].view(-1, num_rotated, head_dim)[..., :rotary_dim]
    half = rotary_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    x.copy_(x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1))


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, features: DecoderFeatures) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        hidden, inter = config.hidden_size, config.intermediate_size
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.intermediate_size = inter
        self.eps = config.rms_norm_eps
        self.features = features
        self.rope_key = features.rope_keys[layer_idx]
        self.attention_options = AttentionOptions(scale=features.attention_scale,
                                                  sliding_window=features.sliding_windows[layer_idx],
                                                  softcap=features.attn_logit_softcap)
        self.qkv_proj = nn.Linear(hidden, q_size + 2 * kv_size, bias=features.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=features.o_bias)
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm = nn.RMSNorm(hidden, eps=self.eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=self.eps)
        if features.sandwich_norms:
            self.pre_feedforward_layernorm = nn.RMSNorm(hidden, eps=self.eps)
            self.post_feedforward_layernorm = nn.RMSNorm(hidden, eps=self.eps)
        if features.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=self.eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=self.eps)
        self.fused_kernels = None  # see use_fused_kernels
        self.fused_projections: tuple = ()  # the kernels' Projection of qkv, o, gate_up, down, in that order

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor, attn_backend: AttentionBackend,
                attn_metadata: object) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's output (the embeddings, with residual None, for the first).

        The residual stream is carried separately and updated in place, so that each add fuses
        with the norm that follows it. Returns (this layer's output, the residual before it)."""
        num_tokens = hidden.shape[0]
        if residual is None:
            residual, hidden = hidden, None
        attention = self.fused_kernels and attn_backend.kernel_arguments(attn_metadata, self.attention_options,
                                                                         self.head_dim)
        if attention:
            slot_mapping, query_ids, block_table, seq_lens, scale = attention
            qkv_proj, o_proj, gate_up_proj, down_proj = self.fused_projections
            return self.fused_kernels.decoder_layer(
                residual, hidden, self.input_layernorm.weight, self.post_attention_layernorm.weight, self.eps,
                qkv_proj, self.num_heads, self.num_kv_heads, self.head_dim, *cos_sin, kv_cache, slot_mapping,
                query_ids, block_table, seq_lens, scale, o_proj, gate_up_proj, self.intermediate_size,
                down_proj), residual
        x = ops.add_rms_norm(residual, hidden, self.input_layernorm.weight, self.eps)
        qkv = self.qkv_proj(x)
        q_size, kv_size, _ = self.qkv_sizes
        if self.features.qk_norm:
            self._norm_heads_(qkv[:, :q_size], self.num_heads, self.q_norm.weight)
            self._norm_heads_(qkv[:, q_size:q_size + kv_size], self.num_kv_heads, self.k_norm.weight)
        # q and k sit side by side in the fused output: rotate both in one pass
        apply_rotary_(qkv, *cos_sin, self.num_heads + self.num_kv_heads, self.head_dim)
        q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_size:q_size + kv_size].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size:].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        attn = attn_backend.forward(q, k, v, kv_cache, attn_metadata, self.attention_options)
        attn = self.o_proj(attn.reshape(num_tokens, -1))
        if not self.features.sandwich_norms:
            x = ops.add_rms_norm(residual, attn, self.post_attention_layernorm.weight, self.eps)
            return self.down_proj(gated_activation(self.gate_up_proj(x), self.features.activation)), residual
        attn = ops.add_rms_norm(attn, None, self.post_attention_layernorm.weight, self.eps)
        x = ops.add_rms_norm(residual, attn, self.pre_feedforward_layernorm.weight, self.eps)
        mlp = self.down_proj(gated_activation(self.gate_up_proj(x), self.features.activation))
        return ops.add_rms_norm(mlp, None, self.post_feedforward_layernorm.weight, self.eps), residual

    def use_fused_kernels(self) -> None:
        """After packing or quantizing: where this layer is Llama's (no q/k norms, no sandwich norms,
        SwiGLU, the whole head rotated) and every projection is in a CPU kernels' layout (bf16 or
        float32 packed, int8, 4-bit: each its own), its steps go through their `decoder_layer`, one
        call, whenever the attention backend's kernel does the layer's attention alone (else the ops
        below one by one: the same kernels, the same bits)."""
        features = self.features
        layers = (self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj)
        if (features.qk_norm or features.sandwich_norms or features.activation != "silu"
                or features.ropes[self.rope_key].rotary_dim != self.head_dim
                or not all(isinstance(p, (PackedLinear, QuantizedLinear)) for p in layers)):
            return
        projections = tuple(p.kernel_projection() for p in layers)
        if None not in projections:
            self.fused_kernels, self.fused_projections = self.qkv_proj.kernels, projections

    def _norm_heads_(self, heads: torch.Tensor, num_heads: int, weight: torch.Tensor) -> None:
        """RMSNorm over each head_dim slice of [n, num_heads * head_dim], in place."""
        x = heads.view(heads.shape[0], num_heads, self.head_dim)
        x.copy_(F.rms_norm(x.float(), (self.head_dim,), weight.float(), self.eps))


class DecoderForCausalLM(nn.Module):
    """A family's causal LM. Subclasses say how their config reads (`features`) and may rename
    checkpoint weights (`checkpoint_name`)."""

    @classmethod
    def features(cls, config) -> DecoderFeatures:
        raise NotImplementedError

    def __init__(self, config, max_positions: int) -> None:
        super().__init__()
        self.config = config
        features = self.features(config)
        self.decoder_features = features
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, features) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None if self.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # plain attributes, not buffers: the model is built on the meta device and its weights loaded afterwards
        self.rotary = {key: RotaryTables(spec, max_positions) for key, spec in features.ropes.items()}
        self.packed_lm_head: nn.Module | None = None  # see pack_cpu_weights

    def pack_cpu_weights(self, stored_dtype: torch.dtype | None = None) -> int:
        """On CPU: the matmul weights packed once for the CPU GEMM (engine/kernels/cpu_linear.py: bf16, and
        float32 on the kernels' fp32 GEMM; stored_dtype bfloat16 holds float32 weights as bf16); elsewhere
        nothing changes. Call after load_weights. Returns how many weights were packed."""
        count = pack_linears(self.layers, stored_dtype)
        self.use_fused_kernels()
        if count:
            head = self.packed_lm_head = pack_linear(self.lm_head_weight, None, stored_dtype)
            count += head is not None
            if head is not None and head.shares_rows and self.lm_head is None:
                # tied: the embedding looks its rows up in the head's packed copy, the only one held
                self.embed_tokens = PackedEmbedding(head)
        return count

    def use_fused_kernels(self) -> None:
        """Each layer through the kernels' one-call decoder layer where it can be
        (DecoderLayer.use_fused_kernels): call once the layers' projections are packed or quantized."""
        for layer in self.layers:
            layer.use_fused_kernels()

    def quantize_cpu_weights(self, quantize_lm_head: bool, lenient: bool) -> int:
        """--quantization int8: every layer's matmul weights to int8 (engine/kernels/int8_linear.py), the
        head too with quantize_lm_head (else packed in bf16, as pack_cpu_weights does); layers left in
        float (lenient) are packed as usual; the layers run fused (use_fused_kernels).
        Call after load_weights. Returns how many weights are int8."""
        count, _ = quantize_linears(self.layers, lenient, prefix="layers")
        pack_linears(self.layers)
        self.use_fused_kernels()
        head = quantize_linear("lm_head", self.lm_head_weight, None, lenient) if quantize_lm_head else None
        count += head is not None
        if head is None:
            head = pack_linear(self.lm_head_weight)
        self.packed_lm_head = head
        if head is not None and head.shares_rows and self.lm_head is None:
            self.embed_tokens = PackedEmbedding(head)  # tied: the head's copy is the only one held
        return count

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every matmul weight once, a tied embedding as the
        head (its packed copy, when there is one, is read instead of the plain one, not as well)."""
        plain = sum(p.numel() * p.element_size() for p in self.parameters())
        shared_head = self.packed_lm_head.weight_bytes if isinstance(self.embed_tokens, PackedEmbedding) else 0
        return plain + shared_head + sum(m.weight_bytes for m in self.layers.modules()
                                         if isinstance(m, (PackedLinear, QuantizedLinear)))

    def resident_weight_bytes(self) -> int:
        """Bytes of weights held in memory: the plain parameters and every packed copy (with its padding)."""
        plain = sum(p.numel() * p.element_size() for p in self.parameters())
        return plain + sum(m.resident_bytes for m in self.modules() if isinstance(m, (PackedLinear, QuantizedLinear)))

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_backend: AttentionBackend, attn_metadata: object,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """Flat 1-D batch in, logits [len(logits_indices), vocab] out (only where they are used)."""
        features = self.decoder_features
        hidden = self.embed_tokens(input_ids)
        if features.embedding_scale is not None:
            hidden = hidden * torch.tensor(features.embedding_scale, dtype=hidden.dtype)
        cos_sin = {key: rotary.cos_sin(positions, hidden.dtype) for key, rotary in self.rotary.items()}
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos_sin[layer.rope_key], kv_cache, attn_backend, attn_metadata)
        hidden = ops.add_rms_norm(residual.index_select(0, logits_indices), hidden.index_select(0, logits_indices),
                                  self.norm.weight, self.norm.eps)
        head = self.packed_lm_head
        if head is not None and head.shares_rows:  # the kernels' GEMM: fp32 sums, never rounded to bf16
            logits = head(hidden, fp32_out=True)
        else:
            logits = (head(hidden) if head is not None else F.linear(hidden, self.lm_head_weight)).float()
            if hidden.dtype != torch.float32 and logits.shape[0]:
                self._refine_top_logits(logits, hidden)
        if features.final_logit_softcap:
            cap = features.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _refine_top_logits(self, logits: torch.Tensor, hidden: torch.Tensor, k: int = 8) -> None:
        """Recompute the k largest logits of each row with exact sums, in place (a bf16 head without
        the CPU kernels, whose GEMM hands back its fp32 sums instead).

        A bf16 matmul rounds its outputs to bf16: logits near 16 land on a grid of 0.06-0.125,
        so close candidates tie or swap, and greedy decoding picks a different token (SmolLM2
        answered "L'Étoile, ..." instead of "The capital of France is Paris."). Summing just the
        leading candidates in float64 costs little (a full fp32 head: 10x the head's time); the
        products of bf16 values are exact, so the logits come out the same whatever order a batched
        matmul adds them in, and a row's greedy token does not depend on the rows beside it."""
        top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        rows = self.lm_head_weight[top].double()  # [n, k, hidden]
        logits.scatter_(1, top, torch.einsum("nd,nkd->nk", hidden.double(), rows).float())

    # ---- weights ---------------------------------------------------------------------

    def checkpoint_name(self, name: str) -> str | None:
        """A checkpoint weight's name in this model (fused parts keep their q_proj/.../up_proj names,
        see weight_loader); None for weights the model does not use."""
        name = name.removeprefix("model.")
        if "rotary_emb" in name or (name == "lm_head.weight" and self.lm_head is None):
            return None  # tied: the embedding is the head
        return name.replace("self_attn.", "").replace("mlp.", "")

    @torch.no_grad()
    def load_weights(self, model_dir: Path) -> None:
        """Fill every parameter from the folder's safetensors, in the parameters' dtype; ValueError
        naming what is missing or unexpected."""
        offset = self.decoder_features.norm_weight_offset
        transform = None
        if offset:
            def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
                return tensor.float() + offset if name.endswith("norm.weight") else tensor
        load_safetensors(self, Path(model_dir), transform)
