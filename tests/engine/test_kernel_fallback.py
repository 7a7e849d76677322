"""The kernels a CPU without AVX-512 runs, forced here: built for AVX2 + FMA (FORMWORK_CPU_ISA=avx2,
their own build folder), then the kernel tests run against them in a process of their own, with
the work split by OpenMP instead of the kernels' worker threads; and the model on them as such a CPU
serves it (dtype auto: float32 activations on the fp32 GEMM, bf16-held weights), against transformers
and op by op."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import cpu_flags

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not {"avx2", "fma"} <= set(cpu_flags()), reason="this CPU has no AVX2 + FMA")]


def run_avx2(*args: str, pool: str = "formwork") -> subprocess.CompletedProcess:
    env = {**os.environ, "FORMWORK_CPU_ISA": "avx2", "FORMWORK_CPU_POOL": pool}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)


def test_the_avx2_build_passes_the_kernel_tests():
    tests = ["tests/engine/test_cpu_linear.py", "tests/engine/test_fp32_gemm.py", "tests/engine/test_cpu_attention.py",
             "tests/engine/test_decoder_ops.py", "tests/engine/test_int8_linear.py",
             "tests/engine/test_int4_linear.py"]
    result = run_avx2("-m", "not slow", *tests, pool="openmp")  # the threads' other split too
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def test_the_model_on_the_avx2_build():
    tests = ["tests/integration/test_fused_decoder_layer.py", "tests/integration/test_model_equivalence.py"]
    result = run_avx2(*tests)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout
