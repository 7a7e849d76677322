"""Summaries, the JSON result file and the PNG plots of `formwork bench serve`.

A run is summarised into one flat dict (`summarize`): who ran it (system, mode, workload), the load
shape, throughput, latency percentiles, grammar times and validity. Peers' records go through the
same function, so every figure in a table or plot is computed the same way.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.request_record import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _pcts(name: str, values: list[float]) -> dict:
    return {f"{name}_p{p}": percentile(values, p) for p in PERCENTILES} | {
        f"{name}_mean": sum(values) / len(values) if values else None}


def summarize(records: list[RequestRecord], wall_s: float, **labels) -> dict:
    """One run's figures. labels: system, mode, workload, concurrency or rate, and anything else."""
    done = [r for r in records if r.ok]
    output_tokens = sum(r.num_output_tokens for r in done)
    itl = [gap for r in done for gap in r.itl_s]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    summary = {
        **labels,
        "num_requests": len(records),
        "num_ok": len(done),
        "num_errors": len(records) - len(done),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
        "wall_s": wall_s,
        "request_throughput": len(done) / wall_s if wall_s > 0 else None,
        "output_token_throughput": output_tokens / wall_s if wall_s > 0 else None,
        "num_output_tokens": output_tokens,
        "mean_output_tokens": output_tokens / len(done) if done else None,
        "mean_prompt_tokens": sum(r.num_prompt_tokens for r in done) / len(done) if done else None,
        **_pcts("ttft_s", [r.ttft_s for r in done]),
        **_pcts("itl_s", itl),
        **_pcts("tpot_s", tpot),
        **_pcts("e2e_s", [r.e2e_s for r in done]),
        **_pcts("grammar_wait_s", [r.server_grammar_wait_s for r in done]),
        **_pcts("queued_s", [r.server_queued_s for r in done]),
    }
    passes = sum(r.forward_passes for r in done)
    summary["forward_passes_per_output_token"] = passes / output_tokens if passes and output_tokens else None
    summary["forced_token_share"] = (sum(r.num_forced_tokens for r in done) / output_tokens) if output_tokens else None
    drafted = sum(r.num_draft_tokens for r in done)
    summary["draft_tokens"] = drafted
    summary["draft_acceptance_rate"] = sum(r.num_accepted_draft_tokens for r in done) / drafted if drafted else None
    return summary


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


# ---- tables -------------------------------------------------------------------------------------


def _fmt(value, digits: int = 1, scale: float = 1.0) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def run_table(runs: list[dict]) -> str:
    """A markdown table of runs: throughput, latency percentiles, grammar wait, validity."""
    lines = ["| system | mode | load | req/s | out tok/s | TTFT p50/p90/p99 (s) | ITL p50/p90/p99 (ms) | "
             "E2E p50/p90/p99 (s) | grammar wait p50/p99 (ms) | fwd/token | valid |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        load = f"c={r['concurrency']}" if r.get("concurrency") else f"{r.get('rate')}/s"
        valid = f"{r['num_valid']}/{r['num_requests']}" if "num_valid" in r else "–"
        if r.get("num_errors"):
            valid += f" ({r['num_errors']} failed: {r['errors'][0][:40]})"
        lines.append(
            f"| {r['system']} | {r['mode']} | {load} | {_fmt(r['request_throughput'], 2)} | "
            f"{_fmt(r['output_token_throughput'])} | "
            f"{_fmt(r['ttft_s_p50'], 2)} / {_fmt(r['ttft_s_p90'], 2)} / {_fmt(r['ttft_s_p99'], 2)} | "
            f"{_fmt(r['itl_s_p50'], 0, 1e3)} / {_fmt(r['itl_s_p90'], 0, 1e3)} / {_fmt(r['itl_s_p99'], 0, 1e3)} | "
            f"{_fmt(r['e2e_s_p50'], 1)} / {_fmt(r['e2e_s_p90'], 1)} / {_fmt(r['e2e_s_p99'], 1)} | "
            f"{_fmt(r['grammar_wait_s_p50'], 1, 1e3)} / {_fmt(r['grammar_wait_s_p99'], 1, 1e3)} | "
            f"{_fmt(r['forward_passes_per_output_token'], 2)} | {valid} |")
    return "\n".join(lines)


def tool_call_table(runs: list[dict]) -> str:
    """A markdown table of the tool-call runs: how the answers' calls fared, and the pace."""
    lines = ["| system | mode | tool_choice | load | answers valid | finished / cut by max_tokens | calls per answer | "
             "answers whose arguments parse | calls valid / calls | out tok/s | TTFT p50 (s) | ITL p50 (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        t = r.get("tool_calls")
        if not t:
            continue
        load = f"c={r['concurrency']}" if r.get("concurrency") else f"{r.get('rate')}/s"
        per_answer = ", ".join(f"{k}: {v}" for k, v in t["calls_per_answer"].items())
        lines.append(
            f"| {r['system']} | {r['mode']} | {r.get('tool_choice', '')} | {load} | {r['num_valid']}/{r['num_requests']} | "
            f"{t['num_answers'] - r['num_length_capped']} / {r['num_length_capped']} | {per_answer} | "
            f"{t['num_answers_arguments_parse']}/{t['num_answers']} | {t['num_calls_schema_valid']}/{t['num_calls']} | "
            f"{_fmt(r['output_token_throughput'])} | {_fmt(r['ttft_s_p50'], 2)} | {_fmt(r['itl_s_p50'], 0, 1e3)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


# ---- plots --------------------------------------------------------------------------------------

_STYLE = {"dpi": 80, "figsize": (6.4, 4.0)}


def _series(runs: list[dict], system: str, mode: str, workload: str | None = None) -> list[dict]:
    rows = [r for r in runs if r["system"] == system and r["mode"] == mode and r.get("concurrency")
            and (workload is None or r.get("workload") == workload)
            and not r.get("num_errors")]  # a run cut by deadlines or errors is no figure to plot
    return sorted(rows, key=lambda r: r["concurrency"])


def _labels(runs: list[dict]) -> list[tuple[str, str]]:
    seen = []
    for r in runs:
        if r.get("concurrency") and (r["system"], r["mode"]) not in seen:
            seen.append((r["system"], r["mode"]))
    return seen


def plot_all(result: dict, out_dir: Path) -> list[Path]:
    """Every plot the result has data for; returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in result.get("runs", []) if r.get("workload") == "json-extraction"]
    written = []

    def save(fig, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=_STYLE["dpi"])
        plt.close(fig)
        written.append(path)

    if runs:  # throughput vs concurrency, every system and mode
        fig, ax = plt.subplots(figsize=_STYLE["figsize"])
        for system, mode in _labels(runs):
            rows = _series(runs, system, mode)
            ax.plot([r["concurrency"] for r in rows], [r["output_token_throughput"] for r in rows], marker="o",
                    label=f"{system} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
        ax.set_title("json-extraction: throughput vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "serve-throughput.png")

        # latency CDFs at the highest concurrency, for every system and mode that ran it
        common = sorted({r["concurrency"] for r in runs})
        target = common[-1]
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6))
        for system, mode in _labels(runs):
            row = next((r for r in _series(runs, system, mode) if r["concurrency"] == target), None)
            if row is None or "cdf" not in row:
                continue
            for ax, key in zip(axes, ("itl_s", "e2e_s")):
                xs = sorted(row["cdf"][key])
                if xs:
                    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{system} {mode}")
        axes[0].set_xscale("log")
        axes[0].set_xlabel("inter-token latency (s)")
        axes[1].set_xlabel("end-to-end latency (s)")
        for ax in axes:
            ax.set_ylabel("fraction of requests" if ax is axes[1] else "fraction of gaps")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=6)
        fig.suptitle(f"latency CDFs, json-extraction at concurrency {target}", fontsize=9)
        save(fig, "serve-latency-cdf.png")

        baseline = "unconstrained-matched" if _series(runs, "formwork", "unconstrained-matched") else "unconstrained"
        base = {r["concurrency"]: r["output_token_throughput"] for r in _series(runs, "formwork", baseline)}
        if base:  # structured / unconstrained
            fig, ax = plt.subplots(figsize=_STYLE["figsize"])
            for mode in ("constrained", "constrained+jf"):
                rows = [r for r in _series(runs, "formwork", mode) if r["concurrency"] in base]
                ax.plot([r["concurrency"] for r in rows],
                        [r["output_token_throughput"] / base[r["concurrency"]] for r in rows], marker="o", label=mode)
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.axhline(0.97, color="red", lw=0.8, ls="--", label="goal 0.97")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel(f"output tok/s ÷ {baseline}")
            ax.set_title("Formwork: structured / unconstrained throughput")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            save(fig, "serve-structured-ratio.png")

        constrained = [(s, m) for s, m in _labels(runs) if m != "unconstrained"]
        fig, ax = plt.subplots(figsize=_STYLE["figsize"])
        width = 0.8 / max(len(constrained), 1)
        for i, (system, mode) in enumerate(constrained):
            rows = _series(runs, system, mode)
            ax.bar([common.index(r["concurrency"]) + i * width for r in rows],
                   [r["output_token_throughput"] for r in rows], width, label=f"{system} {mode}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(common))], [f"c={c}" for c in common])
        ax.set_ylabel("output tokens/s (constrained)")
        ax.set_title("Formwork vs peers, same prompts and schemas")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        save(fig, "serve-peers.png")

    roof = result.get("roofline")
    if roof and roof.get("curve"):
        fig, ax = plt.subplots(figsize=_STYLE["figsize"])
        curve = roof["curve"]
        ax.plot([c["batch"] for c in curve], [c["step_ms"] for c in curve], marker="o", label="decode step (ITL p50)")
        ax.axhline(roof["floor_ms"], color="red", ls="--", label=f"weight-read floor {roof['floor_ms']:.1f} ms")
        ax2 = ax.twinx()
        ax2.plot([c["batch"] for c in curve], [c["tokens_per_s"] for c in curve], marker="s", color="green",
                 label="output tok/s")
        ax2.set_ylabel("output tokens/s", color="green")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests (unconstrained)")
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"roofline: {roof['bandwidth_gbs']:.1f} GB/s, {roof['weight_mib']:.0f} MiB of weights")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        save(fig, "serve-roofline.png")
    return written


def markdown(result: dict) -> str:
    """The result as markdown: runs, grammar compiles, roofline, burst, peers, goals."""
    meta = result.get("meta", {})
    out = [f"{meta.get('date', '')}, {meta.get('cpu', '')}, {meta.get('cores')} cores, "
           f"{meta.get('memory_gib')} GiB, load average at start {meta.get('load_average')}, commit {meta.get('commit')}",
           "", run_table(result.get("runs", []))]
    tools = tool_call_table(result.get("runs", []))
    if tools:
        out += ["", tools]
    for workload, c in (result.get("grammar_compile") or {}).items():
        out.append(f"\nGrammar compiles ({workload}, ValidateConstraint before the load): {c['num_compiled']} schemas, "
                   f"p50 {_fmt(c['compile_s_p50'], 1, 1e3)} / p90 {_fmt(c['compile_s_p90'], 1, 1e3)} / "
                   f"p99 {_fmt(c['compile_s_p99'], 1, 1e3)} ms, max {_fmt(c['compile_s_max'], 1, 1e3)} ms; "
                   f"{c['num_rejected']} rejected")
    roof = result.get("roofline")
    if roof:
        out.append(f"\nRoofline: copy bandwidth {roof['bandwidth_gbs']:.1f} GB/s, weights {roof['weight_mib']:.0f} MiB, "
                   f"floor {roof['floor_ms']:.1f} ms/step; batch-1 step {_fmt(roof['batch1_step_ms'])} ms = "
                   f"{_fmt(roof['batch1_step_over_floor'], 2)}x the floor\n\n| batch | step (ITL p50) ms | x floor | out tok/s |"
                   "\n|---|---|---|---|")
        for c in roof["curve"]:
            out.append(f"| {c['batch']} | {c['step_ms']:.1f} | {c['step_over_floor']:.2f} | {c['tokens_per_s']:.1f} |")
    burst = result.get("burst")
    if burst:
        out.append(f"\nNew-schema burst: {burst['steady_concurrency']} steady requests, bursts of {burst['burst_size']}, "
                   f"{burst['window_s']:.0f} s window x {burst['repeats']}\n\n| burst | gaps | ITL mean ms | p50 | p90 | p99 |"
                   "\n|---|---|---|---|---|---|")
        for name, p in burst["phases"].items():
            out.append(f"| {name} | {p['num_gaps']} | {_fmt(p['itl_mean_s'], 1, 1e3)} | {_fmt(p['itl_p50_s'], 1, 1e3)} | "
                       f"{_fmt(p['itl_p90_s'], 1, 1e3)} | {_fmt(p['itl_p99_s'], 1, 1e3)} |")
        out.append(f"\nnew / seen ITL mean {_fmt(burst['new_vs_seen_itl_mean'], 3)}, p50 "
                   f"{_fmt(burst['new_vs_seen_itl_p50'], 3)}; grammar wait of the new schemas "
                   f"{ {k: _fmt(v, 3) for k, v in burst['new_burst_grammar_wait_s'].items()} } s")
    for name, peer in (result.get("peers") or {}).items():
        out.append(f"\nPeer {name}: {peer['status']} — {peer.get('version') or peer.get('reason', '')[:300]}")
    for name, goal in (result.get("goals") or {}).items():
        out.append(f"\nGoal {name}: {goal}")
    return "\n".join(out)


if __name__ == "__main__":  # python -m bench.report RESULT.json [PLOTS_DIR]: markdown, and the plots again
    import sys
    loaded = json.loads(Path(sys.argv[1]).read_text())
    print(markdown(loaded))
    if len(sys.argv) > 2:
        for written in plot_all(loaded, Path(sys.argv[2])):
            print(written, file=sys.stderr)
