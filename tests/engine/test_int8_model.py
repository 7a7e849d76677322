"""`--quantization int8` end to end: tiny random Llamas (tests/model_families.py) and the default
model as a Q8_0 GGUF file served from its own blocks."""
from __future__ import annotations

import random
import shutil

import pytest
from model_families import save_family

from bench.quantization_agreement import agreement, greedy_answers, teacher_forced_choices
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.kernels.cpu_linear import PackedEmbedding, PackedLinear
from engine.kernels.int8_linear import Int8Linear
from engine.sampling_params import SamplingParams


def make_llm(model: str, **config):
    from engine.llm import LLM
    return LLM(model=model, config=EngineConfig(dtype="bfloat16", scheduler=SchedulerConfig(max_num_batched_tokens=64),
                                                cache=CacheConfig(num_blocks=256), **config))


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.randrange(5, 90))] for _ in range(count)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, model_dir):
    """A tiny random Llama with tied embeddings and q/k/v/o biases."""
    out = tmp_path_factory.mktemp("llama2-linear")
    save_family("llama2-linear", out, model_dir)
    return str(out)


class CountedLayerCalls:
    """The kernels with their decoder_layer calls counted."""

    def __init__(self, kernels) -> None:
        self.kernels, self.calls = kernels, 0

    def decoder_layer(self, *args):
        self.calls += 1
        return self.kernels.decoder_layer(*args)


def assert_the_fused_layers_give_the_op_by_op_bits(llm, num_prompts: int = 4) -> None:
    """Every layer runs as the kernels' one call, and its tokens and logprobs are those of the same
    model op by op (prompts longer than the 64-token budget: chunked, beside the others' decodes)."""
    layers = llm.engine.runner.model.layers
    kernels = layers[0].fused_kernels
    assert kernels is not None and all(layer.fused_kernels is kernels for layer in layers)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3, speculative=False)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(num_prompts, seed=2)]

    def answers() -> str:  # as text: a random model's NaN logprobs compare equal too
        return repr([(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs])
                     for o in llm.generate(prompts, params)])

    counted = CountedLayerCalls(kernels)
    for layer in layers:
        layer.fused_kernels = counted
    fused = answers()
    assert counted.calls >= len(layers) * (params.max_tokens - 1)  # at least the last prompt's decode steps
    for layer in layers:
        layer.fused_kernels = None
    assert answers() == fused
    for layer in layers:
        layer.fused_kernels = kernels


def test_int8_layers_replace_every_matmul(kernels, tiny_llama):
    llm = make_llm(tiny_llama, quantization="int8")
    try:
        model = llm.engine.runner.model
        for layer in model.layers:
            assert all(isinstance(p, Int8Linear) for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                           layer.down_proj))
        assert layer.qkv_proj.bias is not None  # the biases join the fp32 sums
        assert isinstance(model.packed_lm_head, PackedLinear)  # the head stays bf16 by default
        assert isinstance(model.embed_tokens, PackedEmbedding)
        assert_the_fused_layers_give_the_op_by_op_bits(llm)
    finally:
        llm.shutdown()


def test_int8_layers_pick_the_unquantized_tokens(kernels, model_dir):
    """The real default model from its safetensors, quantized per channel: greedy tokens agree with
    the unquantized model's (teacher-forced) on at least 90% of positions. (Random tiny models are
    no measure of this: their near-uniform logits flip under any rounding.)"""
    from bench.prompts import chat_prompts
    plain = make_llm(str(model_dir))
    try:
        prompts = [plain.encode_prompt(p) for p in chat_prompts(12)]
        reference = greedy_answers(plain, prompts, 16)
    finally:
        plain.shutdown()
    llm = make_llm(str(model_dir), quantization="int8")
    try:
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.down_proj, Int8Linear) and layer.down_proj.scales.shape[1] == 1  # per channel
        assert agreement(reference, teacher_forced_choices(llm, prompts, reference)) >= 0.9
    finally:
        llm.shutdown()


def test_int8_rows_do_not_depend_on_the_batch(kernels, tiny_llama):
    """Each prompt alone, then all together with prompts chunked beside decodes: the same tokens and logprobs."""
    llm = make_llm(tiny_llama, quantization="int8", quantize_lm_head=True)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2, speculative=False)
    try:
        model = llm.engine.runner.model
        assert isinstance(model.packed_lm_head, Int8Linear)  # tied: the embedding reads the int8 head
        assert model.embed_tokens.head is model.packed_lm_head
        prompts = [{"prompt_token_ids": p} for p in random_prompts(6, seed=1)]

        def answers(outputs):
            return [(o.token_ids, [(lp.token_id, lp.logprob) for lp in o.logprobs]) for o in outputs]

        alone = [answers(llm.generate([p], params))[0] for p in prompts]
        assert answers(llm.generate(prompts, params)) == alone
    finally:
        llm.shutdown()


def test_a_layer_the_kernel_cannot_take_is_named(kernels, tmp_path, model_dir):
    """intermediate_size 48: down_proj's 48 input features are not whole groups of 32."""
    import torch
    from model_families import TOKENIZER_FILES, family_config
    from transformers import AutoModelForCausalLM

    config = family_config("llama3")
    config.intermediate_size = 48
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, tmp_path / name)
    with pytest.raises(ValueError, match=r"layer layers\.0\.down_proj cannot be quantized.*int8:lenient"):
        make_llm(str(tmp_path), quantization="int8")
    llm = make_llm(str(tmp_path), quantization="int8:lenient")
    try:
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.gate_up_proj, Int8Linear) and isinstance(layer.down_proj, PackedLinear)
        assert len(llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0))[0].token_ids) == 4
    finally:
        llm.shutdown()


def test_quantization_settings_are_checked():
    with pytest.raises(ValueError, match="CPU only"):
        EngineConfig(device="cuda", quantization="int8")
    with pytest.raises(ValueError, match="int8, int8:lenient"):
        EngineConfig(quantization="int4")
    with pytest.raises(ValueError, match="needs quantization"):
        EngineConfig(quantize_lm_head=True)
    assert EngineConfig(quantization="int8:lenient").quantization_lenient


def test_an_unsupported_gguf_type_names_itself(tmp_path):
    import gguf
    import numpy as np

    from engine.model_files import gguf_matmul_types
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, 66), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_down\.weight is IQ2_XXS.*supported: F32, F16, BF16, Q4_0"):
        gguf_matmul_types(path)


def test_the_start_up_line_says_a_4_bit_file_is_served_in_4_bit(caplog):
    import logging

    from engine.model_files import resolve_model
    with caplog.at_level(logging.INFO, logger="engine.model_files"):
        resolve_model(None, "int8")  # the packaged file: Q4_1
    assert "SmolLM2-135M-Instruct.Q4_1.gguf: matmul weights served from the file: Q4_1 in 4-bit" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engine.model_files"):
        resolve_model(None)
    assert "int8" not in caplog.text


def test_a_random_q8_0_gguf_of_another_shape_is_served(kernels, tmp_path, monkeypatch):
    """bench.q8_0_gguf --random-shape: a file of that shape, with the source's tokenizer, that the
    int8 GGUF path reads as it is."""
    import gguf

    from bench.q8_0_gguf import write_random_q8_0
    from engine.model_files import default_gguf_path
    shape = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 96, "attention.head_count": 2,
             "attention.head_count_kv": 1, "rope.dimension_count": 32}
    path = write_random_q8_0(default_gguf_path(), tmp_path / "random.gguf", shape)
    types = {t.name: (t.tensor_type.name, tuple(t.shape)) for t in gguf.GGUFReader(path).tensors}
    assert types["blk.1.ffn_down.weight"] == ("Q8_0", (96, 64)) and types["blk.0.attn_k.weight"] == ("Q8_0", (64, 32))
    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))  # the kernels are loaded already
    llm = make_llm(str(path), quantization="int8")
    try:
        model = llm.engine.runner.model
        assert len(model.layers) == 2 and isinstance(model.layers[1].down_proj, Int8Linear)
        assert model.layers[1].down_proj.in_features == 96
        assert model.layers[1].down_proj.scales.shape[1] > 1  # a scale per 32 values: Q8_0, fused too
        assert_the_fused_layers_give_the_op_by_op_bits(llm)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def q8_0_gguf(tmp_path_factory):
    """The default model with its weights as Q8_0 (bench/q8_0_gguf.py)."""
    from bench.q8_0_gguf import write_q8_0_copy
    from engine.model_files import default_gguf_path
    return write_q8_0_copy(default_gguf_path(), tmp_path_factory.mktemp("gguf") / "smollm2-q8_0.gguf")


@pytest.mark.slow
def test_a_q8_0_gguf_is_served_from_its_blocks(kernels, q8_0_gguf, tmp_path, monkeypatch):
    import gguf
    import torch

    from engine.model_files import gguf_weights_file, resolve_model
    plain = make_llm(None)
    prompts = [plain.encode_prompt([{"role": "user", "content": f"Tell me about {topic}."}])
               for topic in ("owls", "rivers", "glass", "bees", "the moon", "bread")]
    try:
        reference = greedy_answers(plain, prompts, 16)
    finally:
        plain.shutdown()
    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))  # the kernels are loaded already
    folder = resolve_model(str(q8_0_gguf), "int8")
    assert gguf_weights_file(folder) == q8_0_gguf.resolve() and not list(folder.glob("*.safetensors"))
    llm = make_llm(str(q8_0_gguf), quantization="int8")
    try:
        model = llm.engine.runner.model
        down = model.layers[0].down_proj
        assert isinstance(down, Int8Linear) and down.scales.shape[1] == 1536 // 32  # the file's own block scales
        tensor = next(t for t in gguf.GGUFReader(q8_0_gguf).tensors if t.name == "blk.0.ffn_down.weight")
        rows = torch.tensor([0, 300, 575])
        expected = torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type))[rows]
        assert torch.equal(down.dequantized_rows(rows), expected)  # the values and scales, as they are
        assert isinstance(model.packed_lm_head, Int8Linear) and model.embed_tokens.head is model.packed_lm_head
        # Q4_1 re-quantized to Q8_0, activations to int8: the bf16 model's tokens nearly everywhere
        assert agreement(reference, teacher_forced_choices(llm, prompts, reference)) >= 0.85
    finally:
        llm.shutdown()
