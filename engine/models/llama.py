"""Llama-family decoder over the paged KV cache (fused QKV and gate/up projections).

transformers supplies the config and the weights; the forward is ours because it reads and writes
the paged cache through an AttentionBackend and computes logits only where they are sampled.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend
from engine.kernels import decoder_ops as ops
from engine.kernels.cpu_linear import PackedEmbedding, PackedLinear, pack_linear, pack_linears

def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported yet (only 'default')")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed as transformers does (fp32) for exact parity."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step tables, gathered once and shared by every layer: [tokens, head_dim] each."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        hidden, inter = config.hidden_size, config.intermediate_size
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(hidden, q_size + 2 * kv_size, bias=getattr(config, "attention_bias", False))
        self.o_proj = nn.Linear(q_size, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm = nn.RMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=config.rms_norm_eps)
        self.intermediate_size = inter
        self.eps = config.rms_norm_eps

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor, attn_backend: AttentionBackend,
                attn_metadata: object) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's output (the embeddings, with residual None, for the first).

        The residual stream is carried separately and updated in place, so that each add fuses
        with the norm that follows it. Returns (this layer's output, the residual before it)."""
        num_tokens = hidden.shape[0]
        if residual is None:
            residual, hidden = hidden, None
        x = ops.add_rms_norm(residual, hidden, self.input_layernorm.weight, self.eps)
        qkv = self.qkv_proj(x)
        q_size, kv_size, _ = self.qkv_sizes
        # q and k sit side by side in the fused output: rotate both in one pass
        ops.rotary_(qkv, *cos_sin, self.num_heads + self.num_kv_heads, self.head_dim)
        q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_size:q_size + kv_size].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size:].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        attn = attn_backend.forward(q, k, v, kv_cache, attn_metadata)
        x = ops.add_rms_norm(residual, self.o_proj(attn.reshape(num_tokens, -1)), self.post_attention_layernorm.weight,
                             self.eps)
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x))), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None if self.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        head_dim = self.layers[0].head_dim
        self.rotary = RotaryEmbedding(head_dim, max_positions, _rope_theta(config))
        self.packed_lm_head: nn.Module | None = None  # see pack_cpu_weights

    def pack_cpu_weights(self) -> int:
        """bf16 on CPU: the matmul weights pre-packed for oneDNN (engine/kernels/cpu_linear.py); elsewhere
        nothing changes. Call after load_weights. Returns how many weights were packed."""
        count = pack_linears(self.layers)
        if count:
            head = self.packed_lm_head = pack_linear(self.lm_head_weight)
            count += head is not None
            if head is not None and head.shares_rows and self.lm_head is None:
                # tied: the embedding looks its rows up in the head's packed copy, the only one held
                self.embed_tokens = PackedEmbedding(head)
        return count

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every matmul weight once, a tied embedding as the
        head (its packed copy, when there is one, is read instead of the plain one, not as well)."""
        plain = sum(p.numel() * p.element_size() for p in self.parameters())
        shared_head = self.packed_lm_head.weight_bytes if isinstance(self.embed_tokens, PackedEmbedding) else 0
        return plain + shared_head + sum(m.weight_bytes for m in self.layers.modules() if isinstance(m, PackedLinear))

    def resident_weight_bytes(self) -> int:
        """Bytes of weights held in memory: the plain parameters and every packed copy (with its padding)."""
        plain = sum(p.numel() * p.element_size() for p in self.parameters())
        return plain + sum(m.resident_bytes for m in self.modules() if isinstance(m, PackedLinear))

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_backend: AttentionBackend, attn_metadata: object,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """Flat 1-D batch in, logits [len(logits_indices), vocab] out (only where they are used)."""
        hidden = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(positions, hidden.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos_sin, kv_cache, attn_backend, attn_metadata)
        hidden = ops.add_rms_norm(residual.index_select(0, logits_indices), hidden.index_select(0, logits_indices),
                                  self.norm.weight, self.norm.eps)
        head = self.packed_lm_head
        logits = (head(hidden) if head is not None else F.linear(hidden, self.lm_head_weight)).float()
        if hidden.dtype != torch.float32:
            self._refine_top_logits(logits, hidden)
        return logits

    def _refine_top_logits(self, logits: torch.Tensor, hidden: torch.Tensor, k: int = 8) -> None:
        """Recompute the k largest logits of each row with fp32 sums, in place.

        A bf16 matmul rounds its outputs to bf16: logits near 16 land on a grid of 0.06-0.125,
        so close candidates tie or swap, and greedy decoding picks a different token (SmolLM2
        answered "L'Étoile, ..." instead of "The capital of France is Paris."). Summing just the
        leading candidates in fp32 costs about 2 ms at 64 rows (a full fp32 head: 20 ms)."""
        top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        head = self.packed_lm_head
        shared = head is not None and head.shares_rows
        rows = (head.rows(top) if shared else self.lm_head_weight[top]).float()  # [n, k, hidden]
        logits.scatter_(1, top, torch.einsum("nd,nkd->nk", hidden.float(), rows))

    @torch.no_grad()
    def load_weights(self, model_dir: Path) -> None:
        """Read safetensors shards, fusing q/k/v and gate/up as they arrive."""
        from safetensors import safe_open

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors weights in {model_dir}")
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    self._load_one(name, f.get_tensor(name), params, loaded)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"weights missing from {model_dir}: {sorted(missing)[:5]}")

    def _load_one(self, name: str, tensor: torch.Tensor, params: dict[str, nn.Parameter], loaded: set[str]) -> None:
        name = name.removeprefix("model.")
        if name == "lm_head.weight" and self.lm_head is None:
            return  # tied: the embedding is the head
        if "rotary_emb" in name:
            return
        for part, fused, index in (("q_proj", "qkv_proj", 0), ("k_proj", "qkv_proj", 1), ("v_proj", "qkv_proj", 2),
                                   ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1)):
            if f".{part}." in name:
                layer = self.layers[int(name.split(".")[1])]
                target_name = name.replace(f"self_attn.{part}", fused).replace(f"mlp.{part}", fused)
                sizes = layer.qkv_sizes if fused == "qkv_proj" else (layer.intermediate_size,) * 2
                offset = sum(sizes[:index])
                params[target_name].data[offset:offset + sizes[index]].copy_(tensor)
                loaded.add(target_name)
                return
        name = name.replace("self_attn.", "").replace("mlp.", "")
        if name not in params:
            raise ValueError(f"unexpected weight {name}")
        params[name].data.copy_(tensor)
        loaded.add(name)
