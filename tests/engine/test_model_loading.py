"""Reading a model folder: the registry of families, rope tables, weights (safetensors, sharded,
any dtype), stop tokens. Everything here builds tiny models; nothing runs the engine loop."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_request, make_scheduler
from model_families import family_config, save_family

from engine.models import SUPPORTED_ARCHITECTURES, model_class
from engine.models.rope import rope_spec, rope_tables
from engine.sched.request import RequestStatus
from engine.sched.scheduler_output import ModelRunnerOutput


class _Config:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_an_unsupported_architecture_is_named_with_the_supported_ones():
    with pytest.raises(ValueError, match="architecture MambaForCausalLM is not supported; supported: .*Qwen3ForCausalLM"):
        model_class(_Config(architectures=["MambaForCausalLM"]))
    assert {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
            "Gemma3ForCausalLM", "Phi3ForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)


def test_an_unsupported_rope_type_is_named_with_the_supported_ones():
    config = family_config("llama3")
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported; supported: default, linear, dynamic"):
        model_class(config).features(config)


def _transformers_tables(config, layer_type=None, seq_len=None):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    params = config.rope_parameters[layer_type] if layer_type else config.rope_parameters
    kwargs = {"layer_type": layer_type} if layer_type else {}
    if params["rope_type"] == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scaling = 1.0
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=seq_len, **kwargs)
    positions = torch.arange(config.max_position_embeddings).float()
    emb = torch.cat((positions[:, None] * inv_freq[None, :],) * 2, dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


@pytest.mark.parametrize("family,layer_type", [("llama3", None), ("llama2-linear", None), ("phi3", None),
                                               ("gemma3", "full_attention"), ("gemma3", "sliding_attention")])
def test_rope_tables_match_transformers(family, layer_type):
    config = family_config(family)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cos, sin = rope_tables(rope_spec(config, head_dim, layer_type), config.max_position_embeddings)
    ref_cos, ref_sin = _transformers_tables(config, layer_type)
    original = getattr(config, "original_max_position_embeddings", None)
    if family == "phi3":  # short factors within the original context, long ones past it
        long_cos, _ = _transformers_tables(config, seq_len=original + 1)
        torch.testing.assert_close(cos[original:], long_cos[original:])
        cos, sin, ref_cos, ref_sin = cos[:original], sin[:original], ref_cos[:original], ref_sin[:original]
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)


def test_dynamic_rope_is_the_default_within_the_context():
    config = family_config("llama3")
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    dynamic = rope_tables(rope_spec(config, 16), 512)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    assert all(torch.equal(a, b) for a, b in zip(dynamic, rope_tables(rope_spec(config, 16), 512)))


def _runner_model(folder, dtype):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = model_class(config)(config, 64)
    model = model.to(dtype).to_empty(device="cpu")
    model.load_weights(folder)
    return model


@pytest.mark.parametrize("saved_dtype", [torch.bfloat16, torch.float16])
def test_weights_load_into_the_served_dtype_from_any_saved_dtype(tmp_path, model_dir, saved_dtype):
    hf_model = save_family("qwen2", tmp_path, model_dir)
    hf_model.to(saved_dtype).save_pretrained(tmp_path)
    model = _runner_model(tmp_path, torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    q_bias = hf_model.model.layers[0].self_attn.q_proj.bias
    torch.testing.assert_close(model.layers[0].qkv_proj.bias[:q_bias.shape[0]].float(), q_bias.float().bfloat16().float())


def test_sharded_checkpoints_load_through_their_index(tmp_path, model_dir):
    hf_model = save_family("phi3", tmp_path, model_dir)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    hf_model.save_pretrained(tmp_path, max_shard_size="2MB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    (tmp_path / "consolidated.safetensors").write_bytes(b"not a checkpoint the index names")
    model = _runner_model(tmp_path, torch.float32)
    torch.testing.assert_close(model.layers[1].gate_up_proj.weight, hf_model.model.layers[1].mlp.gate_up_proj.weight)


def test_missing_and_misshapen_weights_are_named(tmp_path, model_dir):
    from safetensors.torch import load_file, save_file

    save_family("llama3", tmp_path, model_dir)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"weights missing .*layers\.1\.qkv_proj\.weight"):
        _runner_model(tmp_path, torch.float32)
    weights["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(3, 3\)"):
        _runner_model(tmp_path, torch.float32)


def test_eos_ids_come_from_generation_config_and_config(tmp_path):
    from engine.config import model_eos_token_ids

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert model_eos_token_ids(tmp_path) == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    assert model_eos_token_ids(tmp_path) == (128001, 128008, 128009, 2)


def test_a_request_stops_on_any_of_its_eos_ids():
    scheduler = make_scheduler()
    requests = [make_request(num_tokens=4) for _ in range(3)]
    for r in requests:
        r.eos_token_ids = frozenset((2, 7))
        scheduler.add_request(r)
    so = scheduler.schedule()
    sampled = {requests[0].request_id: [7], requests[1].request_id: [2], requests[2].request_id: [5]}
    outputs = {o.request_id: o for o in scheduler.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens),
                                                                                          sampled))}
    assert [r.status for r in requests] == [RequestStatus.FINISHED_STOPPED] * 2 + [RequestStatus.RUNNING]
    assert outputs[requests[0].request_id].stop_reason == 7


@pytest.mark.slow
def test_a_gguf_file_is_prepared_once_into_the_cache(tmp_path, monkeypatch):
    """The packaged SmolLM2 GGUF, given as a user's file: dequantized into the cache once, then reused."""
    from engine.model_files import default_gguf_path, resolve_model

    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "user-model.gguf"
    gguf.symlink_to(default_gguf_path())
    folder = resolve_model(str(gguf))
    assert folder.parent == tmp_path / "cache" / "models" and folder.name.startswith("user-model-")
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert list(folder.glob("*.safetensors"))
    marker = next(folder.glob(".formwork-ready")).stat().st_mtime_ns
    assert resolve_model(str(gguf)) == folder
    assert next(folder.glob(".formwork-ready")).stat().st_mtime_ns == marker  # not prepared again
