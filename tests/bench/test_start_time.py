"""`python -m bench.start_time` starts the engine in a fresh process and reports both waits."""
from __future__ import annotations

import re
import subprocess
import sys


def test_a_start_is_timed_in_its_own_process():
    out = subprocess.run([sys.executable, "-m", "bench.start_time", "--repeats", "1"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    ready, first = map(float, re.search(r"best of 1: ready ([\d.]+) s, first answer ([\d.]+) s", out).groups())
    assert 0 < ready <= first
