"""What a `formwork bench serve` result is judged by: the goals' ratios against the peers and
against Formwork's own modes, and the smoke checks that fail `make bench-smoke`."""
from __future__ import annotations

import math


def goals(runs: list[dict], burst: dict | None) -> dict:
    def find(system: str, mode: str, c: int) -> dict | None:
        return next((r for r in runs if r["system"] == system and r["mode"] == mode and r.get("concurrency") == c), None)

    out = {}
    # transformers runs right after Formwork's runs; the other peers after it, then Formwork again
    fw64, hf64 = find("formwork", "constrained+jf", 64), find("transformers", "constrained", 64)
    fw64_after = find("formwork", "constrained+jf (after peers)", 64) or fw64
    if fw64 and hf64:
        out["vs_transformers_c64"] = {"ratio": fw64["output_token_throughput"] / hf64["output_token_throughput"],
                                      "formwork_valid": f"{fw64['num_valid']}/{fw64['num_requests']}",
                                      "transformers_valid": f"{hf64['num_valid']}/{hf64['num_requests']}", "goal": 5.0}
    for peer in ("llama-cpp", "vllm", "vllm-compiled"):
        best = max((r["output_token_throughput"] for r in runs if r["system"] == peer), default=None)
        if best and fw64_after:
            out[f"vs_{peer}_best"] = {"ratio": fw64_after["output_token_throughput"] / best, "goal": 1.0,
                                      "formwork": fw64_after["mode"]}
    base = find("formwork", "unconstrained-matched", 32) or find("formwork", "unconstrained", 32)
    for mode, goal in (("constrained", 0.97), ("constrained+jf", 1.0)):
        r = find("formwork", mode, 32)
        if base and r:  # throughput, and step time (ITL p50): answers differ in length between modes
            out[f"{mode}_over_unconstrained_c32"] = {
                "ratio": r["output_token_throughput"] / base["output_token_throughput"], "goal": goal,
                "baseline": base["mode"],
                "itl_p50_ratio": base["itl_s_p50"] / r["itl_s_p50"] if r["itl_s_p50"] else None}
    top = max((r["concurrency"] for r in runs if r["system"] == "formwork-http" and r.get("concurrency")), default=None)
    for mode in ("constrained+jf", "constrained", "unconstrained"):
        grpc_top, http_top = find("formwork", mode, top), find("formwork-http", mode, top)
        grpc_c1, http_c1 = find("formwork", mode, 1), find("formwork-http", mode, 1)
        if grpc_top and http_top:
            out[f"http_over_grpc_throughput_c{top}"] = {
                "ratio": http_top["output_token_throughput"] / grpc_top["output_token_throughput"], "goal": ">= 0.95",
                "mode": mode}
        if grpc_c1 and http_c1 and grpc_c1["ttft_s_p50"] and http_c1["ttft_s_p50"]:
            out["http_minus_grpc_ttft_p50_c1_ms"] = {
                "value": 1000 * (http_c1["ttft_s_p50"] - grpc_c1["ttft_s_p50"]), "goal": "<= 5", "mode": mode}
        if grpc_top or grpc_c1:
            break
    for c, goal in ((1, 2.0), (8, 1.5), (64, 1.0)):  # speculative decoding against the same requests without it
        off, on = find("formwork", "constrained+jf", c), find("formwork", "constrained+jf+spec", c)
        if off and on and off["output_token_throughput"]:
            out[f"speculative_over_plain_c{c}"] = {
                "ratio": on["output_token_throughput"] / off["output_token_throughput"], "goal": goal,
                "acceptance_rate": on["draft_acceptance_rate"],
                "forward_passes_per_output_token": [off["forward_passes_per_output_token"],
                                                    on["forward_passes_per_output_token"]],
                "num_valid": [off["num_valid"], on["num_valid"]]}
    for c in (1, 8):  # the anchor: vLLM's n-gram speculation beside its structured outputs, same requests
        ours, vllm_ngram = find("formwork", "constrained+jf+spec", c), find("vllm-ngram", "constrained", c)
        vllm_plain = find("vllm", "constrained", c)
        if ours and vllm_ngram and vllm_ngram["output_token_throughput"]:
            out[f"speculative_vs_vllm_ngram_c{c}"] = {
                "ratio": ours["output_token_throughput"] / vllm_ngram["output_token_throughput"], "goal": 1.0,
                "vllm_ngram_over_vllm": (vllm_ngram["output_token_throughput"] / vllm_plain["output_token_throughput"]
                                         if vllm_plain and vllm_plain["output_token_throughput"] else None)}
    if burst and burst.get("new_vs_seen_itl_mean"):
        out["burst_itl_increase"] = {"ratio": burst["new_vs_seen_itl_mean"], "goal": "< 1.05"}
    return out


def smoke_checks(result: dict) -> list[str]:
    problems = []
    for r in result["runs"]:
        name = f"{r['system']} {r['mode']} c={r['concurrency']}"
        if r["num_errors"]:
            problems.append(f"{name}: {r['num_errors']} failed requests: {r['errors']}")
        for key in ("output_token_throughput", "request_throughput", "ttft_s_p50", "itl_s_p50", "e2e_s_p99"):
            value = r.get(key)
            if value is None or not math.isfinite(value) or value <= 0:
                problems.append(f"{name}: {key} = {value}")
        # a constrained answer that ended must validate; one cut at max_tokens is a runaway the
        # grammar allows (reported, counted as not valid), not a broken engine
        if r["mode"] != "unconstrained" and r["num_finished_invalid"]:
            problems.append(f"{name}: {r['num_finished_invalid']} finished outputs invalid: {r['invalid_samples']}")
        if r["mode"] != "unconstrained" and r["num_valid"] + r["num_length_capped"] != r["num_requests"]:
            problems.append(f"{name}: only {r['num_valid']}/{r['num_requests']} outputs valid: {r['invalid_samples']}")
        fpt = r.get("forward_passes_per_output_token")  # above 1 only by the prompts' extra prefill chunks
        if fpt is None or not 0 < fpt < 1.5:
            problems.append(f"{name}: forward passes per output token = {fpt}")
        if r["ttft_s_p50"] and r["e2e_s_p50"] and r["ttft_s_p50"] > r["e2e_s_p99"] + 1e-6:
            problems.append(f"{name}: TTFT p50 above E2E p99")
    return problems
