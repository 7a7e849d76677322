"""What `formwork bench serve` judges speculation by: on over off at each load, and the anchor
(vLLM's n-gram speculation on the same requests) beside it. Hand-made run summaries."""
from __future__ import annotations

import pytest

from bench.serve_goals import goals


def run(system: str, mode: str, concurrency: int, tok_s: float, **extra) -> dict:
    return {"system": system, "mode": mode, "concurrency": concurrency, "output_token_throughput": tok_s,
            "num_valid": 8, "num_requests": 8, "forward_passes_per_output_token": extra.pop("fpt", None),
            "draft_acceptance_rate": extra.pop("accepted", None), **extra}


def test_speculation_is_judged_against_itself_off_and_against_vllm_ngram():
    runs = [run("formwork", "constrained+jf", 1, 20.0, fpt=0.6),
            run("formwork", "constrained+jf+spec", 1, 30.0, fpt=0.4, accepted=0.36),
            run("formwork", "constrained+jf", 8, 100.0, fpt=0.6),
            run("formwork", "constrained+jf+spec", 8, 120.0, fpt=0.4, accepted=0.42),
            run("vllm-ngram", "constrained", 1, 25.0), run("vllm", "constrained", 1, 10.0),
            run("vllm-ngram", "constrained", 8, 150.0)]
    out = goals(runs, None)
    assert out["speculative_over_plain_c1"]["ratio"] == pytest.approx(1.5)
    assert out["speculative_over_plain_c1"]["goal"] == 2.0
    assert out["speculative_over_plain_c8"]["ratio"] == pytest.approx(1.2)
    assert out["speculative_over_plain_c8"]["forward_passes_per_output_token"] == [0.6, 0.4]
    assert out["speculative_vs_vllm_ngram_c1"]["ratio"] == pytest.approx(30.0 / 25.0)
    assert out["speculative_vs_vllm_ngram_c1"]["vllm_ngram_over_vllm"] == pytest.approx(2.5)
    assert out["speculative_vs_vllm_ngram_c8"]["ratio"] == pytest.approx(0.8)
    assert out["speculative_vs_vllm_ngram_c8"]["vllm_ngram_over_vllm"] is None  # plain vLLM did not run at c=8
    assert "speculative_over_plain_c64" not in out


def test_no_anchor_without_the_vllm_ngram_peer():
    out = goals([run("formwork", "constrained+jf", 1, 20.0), run("formwork", "constrained+jf+spec", 1, 30.0)], None)
    assert "speculative_vs_vllm_ngram_c1" not in out
