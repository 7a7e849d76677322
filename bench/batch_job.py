"""Batch jobs against LLM.generate, and a batch job killed and resumed (figures for docs/batch.md).

    python -m bench.batch_job throughput [--num-docs 200] [--max-tokens 128] [--batch-sizes 16,32,64] [--repeats 2]
    python -m bench.batch_job robustness [--num-docs 200] [--max-tokens 64] [--kills 3] [--seed 0]

throughput: an N-document extraction job (bench/data/json_extraction.jsonl's items, cycled; each
item's schema as its constraint, greedy) run by LLM.generate at each batch size (max_num_seqs), and
by the batch runner over the engine in this process as `formwork batch` runs it (twice the batch
in flight) at LLM.generate's best batch size; then rounds alternating the two, each keeping its
fastest. Both run warm: every grammar compiled and every prompt in the prefix cache (a first
untimed run each). The engine's start is not timed on either side.

robustness: `formwork batch` on the same kind of job, uninterrupted (the reference), then killed with
SIGKILL (the job and its engine process) at `--kills` random points, resumed each time, and run to
the end: every custom_id must be in the output exactly once, each answer the reference's.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.workloads import extraction_prompt, load_json_extraction

REPO_ROOT = Path(__file__).resolve().parents[1]


def job_items(num_docs: int) -> list[dict]:
    items = load_json_extraction()
    return [items[i % len(items)] for i in range(num_docs)]


def request_line(index: int, item: dict, max_tokens: int) -> dict:
    return {"custom_id": f"doc-{index}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": extraction_prompt(item), "max_tokens": max_tokens, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "extraction", "schema": item["schema"]}}}}


@dataclass
class Run:
    name: str
    seconds: float
    num_answers: int
    num_tokens: int

    def show(self) -> str:
        return (f"{self.name:<34} {self.seconds:7.2f} s  {self.num_answers / self.seconds:6.2f} answers/s  "
                f"{self.num_tokens / self.seconds:7.1f} tok/s  ({self.num_tokens} tokens)")


def llm_generate(llm, items: list[dict], max_tokens: int, name: str) -> Run:
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint

    params = [SamplingParams(temperature=0, max_tokens=max_tokens,
                             constraint=Constraint(kind="json_schema", spec=json.dumps(item["schema"])))
              for item in items]
    prompts = [extraction_prompt(item) for item in items]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return Run(name, time.perf_counter() - start, len(outputs), sum(o.num_output_tokens for o in outputs))


async def batch_job(executor, lines: list[dict], name: str) -> Run:
    from service.batch.lines import read_lines
    from service.batch.output_file import OutputFile
    from service.batch.progress import Progress
    from service.batch.runner import BATCH_RECORDS, JobRunner

    parsed = read_lines([json.dumps(line).encode() for line in lines])
    with tempfile.TemporaryDirectory() as folder, OutputFile(Path(folder) / "out.jsonl", BATCH_RECORDS.key_of) as out:
        runner = JobRunner(executor, out, Progress(io.StringIO(), is_tty=False))
        start = time.perf_counter()
        result = await runner.run(parsed)
        seconds = time.perf_counter() - start
    counts = result.counts
    assert counts.num_failed == 0 and result.stopped is None, result
    return Run(name, seconds, counts.num_done, counts.num_tokens)


async def throughput(args: argparse.Namespace, engine_config) -> int:
    from engine.config import SchedulerConfig
    from engine.llm import LLM
    from service.batch_cli.inprocess import InProcessExecutor
    from service.limits import ServiceLimits

    items = job_items(args.num_docs)
    lines = [request_line(i, item, args.max_tokens) for i, item in enumerate(items)]
    print(f"{args.num_docs} extraction documents (bench/data/json_extraction.jsonl cycled), greedy, schema-"
          f"constrained, max_tokens {args.max_tokens}; warm runs (grammars compiled, prompts in the prefix cache)",
          flush=True)

    def config_at(batch_size: int):
        return replace(engine_config, scheduler=SchedulerConfig(
            max_num_seqs=batch_size, max_num_batched_tokens=engine_config.scheduler.max_num_batched_tokens))

    by_size: dict[int, Run] = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        llm = LLM(config=config_at(batch_size))
        llm_generate(llm, items, args.max_tokens, "warm-up")
        by_size[batch_size] = llm_generate(llm, items, args.max_tokens, f"LLM.generate batch {batch_size}")
        print(by_size[batch_size].show(), flush=True)
        llm.shutdown()
    best = max(by_size, key=lambda b: by_size[b].num_tokens / by_size[b].seconds)
    print(f"best LLM.generate batch size: {best}", flush=True)

    llm = LLM(config=config_at(best))
    executor = await InProcessExecutor.start(config_at(best), ServiceLimits())
    try:
        llm_generate(llm, items, args.max_tokens, "warm-up")
        await batch_job(executor, lines, "warm-up")
        fastest: dict[str, Run] = {}
        for _ in range(args.repeats):  # alternated; each side keeps its fastest round
            for run in (llm_generate(llm, items, args.max_tokens, f"LLM.generate batch {best}"),
                        await batch_job(executor, lines, f"formwork batch (in process) {best}")):
                print(run.show(), flush=True)
                if run.name not in fastest or run.seconds < fastest[run.name].seconds:
                    fastest[run.name] = run
    finally:
        await executor.aclose()
        llm.shutdown()
    offline, job = fastest.values()
    print(f"fastest of {args.repeats}: formwork batch / LLM.generate = "
          f"{(job.num_tokens / job.seconds) / (offline.num_tokens / offline.seconds):.3f} (tok/s), "
          f"{(job.num_answers / job.seconds) / (offline.num_answers / offline.seconds):.3f} (answers/s)")
    return 0


def _batch_command(input_path: Path, output_path: Path, engine_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "cli.main", "batch", str(input_path), str(output_path), *engine_args]


def _answers(path: Path) -> dict[str, str]:
    records = [json.loads(text) for text in path.read_text().splitlines()]
    answers = {r["custom_id"]: json.dumps(r["response"]["body"]["choices"][0]["message"]) for r in records}
    if len(answers) != len(records):
        raise AssertionError(f"{path}: a custom_id written twice")
    return answers


def robustness(args: argparse.Namespace, engine_args: list[str]) -> int:
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="batch-robustness-"))
    input_path = folder / "in.jsonl"
    input_path.write_text("".join(json.dumps(request_line(i, item, args.max_tokens)) + "\n"
                                  for i, item in enumerate(job_items(args.num_docs))))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    subprocess.run(_batch_command(input_path, folder / "reference.jsonl", engine_args), cwd=REPO_ROOT, env=env,
                   check=True, stderr=subprocess.DEVNULL)
    print(f"reference (uninterrupted): {args.num_docs} lines in {time.perf_counter() - start:.1f} s", flush=True)
    reference = _answers(folder / "reference.jsonl")
    output_path = folder / "out.jsonl"
    kill_points = sorted(rng.sample(range(1, args.num_docs), args.kills))
    for point in kill_points:
        job = subprocess.Popen(_batch_command(input_path, output_path, engine_args), cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while (not output_path.exists() or output_path.read_bytes().count(b"\n") < point) and job.poll() is None:
            time.sleep(0.001)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        data = output_path.read_bytes()
        num_lines, torn = data.count(b"\n"), len(data) - (data.rfind(b"\n") + 1)
        print(f"killed (SIGKILL) at {num_lines} lines written (target {point}; the job "
              f"{'was killed' if job.returncode == -signal.SIGKILL else 'had ended'}); torn last line: "
              f"{torn} bytes", flush=True)
    subprocess.run(_batch_command(input_path, output_path, engine_args), cwd=REPO_ROOT, env=env, check=True,
                   stderr=subprocess.DEVNULL)
    answers = _answers(output_path)
    missing, extra = set(reference) - set(answers), set(answers) - set(reference)
    different = [key for key in reference if key in answers and answers[key] != reference[key]]
    print(f"resumed to the end: {len(answers)} custom_ids, each once; missing {len(missing)}, unexpected "
          f"{len(extra)}, answers different from the reference: {len(different)}")
    return 0 if not (missing or extra or different) else 1


def main(argv: list[str] | None = None) -> int:
    from engine import args as engine_args

    parser = argparse.ArgumentParser(prog="python -m bench.batch_job", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_subparsers(dest="which", required=True)
    speed = which.add_parser("throughput")
    speed.add_argument("--num-docs", type=int, default=200)
    speed.add_argument("--max-tokens", type=int, default=128)
    speed.add_argument("--batch-sizes", default="16,32,64")
    speed.add_argument("--repeats", type=int, default=2)
    engine_args.add_engine_args(speed)
    kills = which.add_parser("robustness")
    kills.add_argument("--num-docs", type=int, default=200)
    kills.add_argument("--max-tokens", type=int, default=64)
    kills.add_argument("--kills", type=int, default=3)
    kills.add_argument("--seed", type=int, default=0)
    args, rest = parser.parse_known_args(argv)
    if args.which == "throughput":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return asyncio.run(throughput(args, engine_args.engine_config_from_args(args)))
    return robustness(args, rest)  # the rest are `formwork batch`'s engine options


if __name__ == "__main__":
    sys.exit(main())
