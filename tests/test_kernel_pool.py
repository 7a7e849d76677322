"""The CPU kernels' worker pool: its counts of who ran a job's chunks, and a helper found on the
caller's CPU is moved off it (a helper that time-slices the caller's CPU adds nothing)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def big_gemm(kernels):
    """A prompt-sized GEMM (the pool splits it into chunks), and a call that runs it."""
    x = torch.randn(512, 576).bfloat16()
    packed = kernels.pack_weight(torch.randn(1536, 576).bfloat16())
    return lambda: kernels.gemm(x, packed, 1536)


def test_the_pool_counts_its_jobs_and_who_ran_their_chunks(kernels):
    run = big_gemm(kernels)
    before = kernels.pool_stats()
    for _ in range(5):
        run()
    after = kernels.pool_stats()
    d = {key: after[key] - before[key] for key in before}
    if torch.get_num_threads() == 1:  # no helpers: every chunk on the caller, no jobs for the pool
        assert d["jobs"] == 0 and d["helper_chunks"] == 0
        return
    assert d["jobs"] >= 5
    assert d["chunks"] >= 2 * d["jobs"]
    assert 0 <= d["joined_jobs"] <= d["jobs"]
    assert 0 <= d["helper_chunks"] <= d["chunks"]
    assert d["same_cpu"] <= d["joined_jobs"]


HELPER_ON_CALLERS_CPU = r"""
import os, time, torch
from engine.kernels.loader import load_cpu_kernels
from test_kernel_pool import big_gemm
torch.set_num_threads(2)
cpus = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, set(cpus))  # the pool's CPUs: these two
kernels = load_cpu_kernels()
run = big_gemm(kernels)
threads = set(os.listdir("/proc/self/task"))
run()  # starts the pool: its helper is the new thread
new = [int(t) for t in set(os.listdir("/proc/self/task")) - threads]
os.sched_setaffinity(0, {cpus[0]})  # the caller, and every new thread, on one CPU
for tid in new:
    os.sched_setaffinity(tid, {cpus[0]})
before = kernels.pool_stats()
deadline = time.monotonic() + 60
while kernels.pool_stats()["moves"] == before["moves"] and time.monotonic() < deadline:
    run()
after = kernels.pool_stats()
moved = [tid for tid in new if os.sched_getaffinity(tid) == {cpus[1]}]
print(after["same_cpu"] - before["same_cpu"], after["moves"] - before["moves"], len(moved))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_helper_on_the_callers_cpu_is_moved_to_another(kernels):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-c", HELPER_ON_CALLERS_CPU], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    same_cpu, moves, moved = map(int, out.stdout.split()[-3:])
    assert same_cpu >= 1  # it ran chunks on the caller's CPU ...
    assert moves >= 1 and moved == 1  # ... so it was given the other one
