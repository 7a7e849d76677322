"""The batch-interference benchmark's arithmetic and report (the run itself needs a server)."""
from __future__ import annotations

import pytest

from bench.batch_interference import format_result, percentile


def test_percentiles_interpolate_between_ranks():
    values = [0.4, 0.1, 0.3, 0.2]
    assert percentile(values, 50) == pytest.approx(0.25)
    assert percentile(values, 99) == pytest.approx(0.397)
    assert percentile([0.5], 99) == 0.5


def test_the_report_names_each_phase_both_latencies_and_the_ratio():
    alone = {"n": 10, "p50_s": 0.5, "p99_s": 1.0, "mean_s": 0.6}
    beside = {**alone, "p99_s": 1.2}
    text = format_result({
        "requests": 10, "max_tokens": 16, "rounds": 1, "batch_lines": 100, "batch_max_tokens": 64,
        "batch_concurrency": 4, "alone": {**alone, "n": 20}, "beside_batch": beside, "p50_ratio": 1.0,
        "p99_ratio": 1.2, "phases": [{"name": "alone", **alone}, {"name": "beside batch", "batch_answered": 7, **beside},
                                     {"name": "alone", **alone}]})
    assert "  beside batch  p50   500.0 ms   p99  1200.0 ms   (n=10, the batch answered 7 lines)" in text
    assert "  alone, all    p50   500.0 ms   p99  1000.0 ms   (n=20)" in text
    assert "p99 x1.20 (goal: p99 within x1.5)" in text
