"""The engine process's heap settings (engine/core/host_memory.py, HostMemoryConfig): checked
offline, then the engine's resident memory over waves of constrained requests in a fresh process
(bench/engine_rss.py, the soak's kind of traffic)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.config import HostMemoryConfig
from engine.core.host_memory import ONEDNN_CACHE_ENVS, HeapTrimmer, configure_host_memory
from live_server import REPO_ROOT

_MIB = 1 << 20


@pytest.mark.parametrize("fields, words", [
    ({"malloc_mmap_threshold_bytes": 0}, "malloc_mmap_threshold_bytes must be in (0, 32 MiB]"),
    ({"malloc_mmap_threshold_bytes": 64 * _MIB}, "glibc's limit"),
    ({"onednn_primitive_cache_capacity": -1}, "onednn_primitive_cache_capacity must be >= 0"),
    ({"trim_interval_s": -1.0}, "trim_interval_s must be >= 0"),
])
def test_bad_host_memory_settings_are_named(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        HostMemoryConfig(**fields)


def test_the_primitive_cache_size_goes_to_the_environment_unless_the_user_set_one(monkeypatch):
    first, second = ONEDNN_CACHE_ENVS
    monkeypatch.delenv(first, raising=False)
    monkeypatch.setenv(second, "7")  # the user's own choice wins
    configure_host_memory(HostMemoryConfig(onednn_primitive_cache_capacity=32, malloc_mmap_threshold_bytes=None))
    assert os.environ[first] == "32" and os.environ[second] == "7"


def test_the_heap_is_trimmed_once_per_interval_and_never_with_zero():
    never = HeapTrimmer(0.0)
    never._last -= 3600
    never.maybe_trim()
    assert never.num_trims == 0
    trimmer = HeapTrimmer(60.0)
    trimmer.maybe_trim()
    assert trimmer.num_trims == 0  # not a minute of steps yet
    trimmer._last -= 61
    trimmer.maybe_trim()
    trimmer.maybe_trim()
    assert trimmer.num_trims == 1


def test_the_heap_is_trimmed_once_when_the_engine_goes_idle_after_steps():
    trimmer = HeapTrimmer(60.0)
    trimmer.on_idle()
    assert trimmer.num_trims == 0  # no step since it started: nothing to hand back
    trimmer.maybe_trim()
    trimmer.on_idle()
    trimmer.on_idle()  # still idle: the heap was trimmed already
    assert trimmer.num_trims == 1
    trimmer.maybe_trim()
    trimmer.on_idle()
    assert trimmer.num_trims == 2
    never = HeapTrimmer(0.0)
    never.maybe_trim()
    never.on_idle()
    assert never.num_trims == 0


def engine_rss_rows(model_dir, *options: str) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "bench.engine_rss", "--model", str(model_dir), *options],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


NUM_WAVES = 9
WARM_WAVES = 4  # the first waves meet most step shapes and the heap's working set
# over the 5 waves after them; measured here: +10 and +22 MiB with the defaults, +68 MiB with
# glibc's and oneDNN's own behaviour (docs/reliability.md, "The engine's heap settings")
MAX_GROWTH_MIB = 40.0


@pytest.mark.slow
def test_engine_rss_stays_flat_once_warm(model_dir):
    rows = engine_rss_rows(model_dir, "--waves", str(NUM_WAVES), "--requests", "64", "--max-tokens", "48")
    waves = rows[1:]
    assert len(waves) == NUM_WAVES and all(w["num_output_tokens"] > 0 for w in waves), rows
    warm = waves[WARM_WAVES - 1]["rss_mib"]
    growth = max(w["rss_mib"] for w in waves[WARM_WAVES:]) - warm
    print(f"engine RSS after each wave (MiB): {[w['rss_mib'] for w in waves]}; +{growth:.0f} MiB once warm")
    assert growth <= MAX_GROWTH_MIB, [w["rss_mib"] for w in waves]
