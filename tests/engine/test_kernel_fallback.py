"""The kernels a CPU without AVX-512 runs, forced here: built for AVX2 + FMA (FORMWORK_CPU_ISA=avx2,
their own build folder), then the kernel tests run against them in a process of their own, with
the work split by OpenMP instead of the kernels' worker threads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_avx2_build_passes_the_kernel_tests():
    env = {**os.environ, "FORMWORK_CPU_ISA": "avx2", "FORMWORK_CPU_POOL": "openmp"}  # the threads' other split too
    tests = ["tests/engine/test_cpu_linear.py", "tests/engine/test_cpu_attention.py", "tests/engine/test_decoder_ops.py",
             "tests/engine/test_int8_linear.py"]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
                             *tests], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
