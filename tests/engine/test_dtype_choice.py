"""What `--dtype auto` (and --cpu-weight-dtype) come to on each kind of device, and what the log says."""
from __future__ import annotations

import argparse

import pytest

from engine import config
from engine.config import EngineConfig


@pytest.fixture
def avx2_only(monkeypatch):
    monkeypatch.setattr(config, "cpu_has_bf16_dot", lambda: False)


def test_auto_on_a_cpu_without_bf16_dots_is_fp32_with_bf16_weights(avx2_only):
    auto = EngineConfig()
    assert auto.torch_dtype == "float32" and auto.cpu_weight_torch_dtype == "bfloat16"
    assert "no bf16 dot products" in auto.dtype_choice and "bfloat16" in auto.dtype_choice
    assert EngineConfig(cpu_weight_dtype="float32").cpu_weight_torch_dtype == "float32"


def test_an_explicit_float32_keeps_its_weights_unless_asked(avx2_only):
    assert EngineConfig(dtype="float32").cpu_weight_torch_dtype is None  # bf16 only where nothing is lost
    asked = EngineConfig(dtype="float32", cpu_weight_dtype="bfloat16")
    assert asked.cpu_weight_torch_dtype == "bfloat16" and asked.dtype_choice.endswith("(as set)")


def test_nothing_is_held_narrower_where_the_model_is_not_float32(monkeypatch):
    monkeypatch.setattr(config, "cpu_has_bf16_dot", lambda: True)
    assert EngineConfig().cpu_weight_torch_dtype is None
    assert "has bf16 dot products" in EngineConfig().dtype_choice
    assert EngineConfig(dtype="bfloat16", cpu_weight_dtype="float32").cpu_weight_torch_dtype is None
    assert EngineConfig(device="cuda", dtype="float32", cpu_weight_dtype="bfloat16").cpu_weight_torch_dtype is None


def test_a_forced_avx2_build_answers_as_an_avx2_cpu(monkeypatch):
    monkeypatch.setattr(config, "cpu_flags", lambda: ["avx2", "fma", "amx_bf16", "avx512_bf16"])
    monkeypatch.setenv("FORMWORK_CPU_ISA", "native")
    assert config.cpu_has_bf16_dot()
    monkeypatch.setenv("FORMWORK_CPU_ISA", "avx2")
    assert not config.cpu_has_bf16_dot()
    assert EngineConfig().torch_dtype == "float32"


def test_a_bad_weight_dtype_is_refused():
    with pytest.raises(ValueError, match="cpu_weight_dtype must be auto, float32 or bfloat16"):
        EngineConfig(cpu_weight_dtype="int8")


def test_the_flag_reaches_the_config():
    from engine.args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--dtype", "float32", "--cpu-weight-dtype", "bfloat16"])
    assert engine_config_from_args(args).cpu_weight_torch_dtype == "bfloat16"


@pytest.mark.skipif(not {"avx2", "fma"} <= set(config.cpu_flags()), reason="this CPU has no AVX2 + FMA")
def test_a_forced_avx2_run_holds_torch_to_avx2_too():
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                            "MKL_ENABLE_INSTRUCTIONS")}
    code = "import engine, torch; print(torch.backends.cpu.get_cpu_capability())"  # engine first, as the CLI does
    result = subprocess.run([sys.executable, "-c", code], env={**env, "FORMWORK_CPU_ISA": "avx2"},
                            capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "AVX2", result.stderr[-2000:]


def test_too_late_to_hold_torch_back_is_said(monkeypatch, caplog):
    import torch  # noqa: F401  (already loaded here: the limits can no longer apply)
    monkeypatch.setenv("FORMWORK_CPU_ISA", "avx2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    config.limit_torch_to_cpu_isa()
    assert "torch was imported first" in caplog.text
    assert "ATEN_CPU_CAPABILITY" not in __import__("os").environ
