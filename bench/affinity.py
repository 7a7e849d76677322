"""`formwork bench affinity`: a burst of new schemas (each sent several times) to replicas behind
Envoy, routed by constraint key and then round robin, in one run on the same replicas.

What it counts: grammar compiles over all replicas (GetModelInfo's num_grammar_compiles, before and
after), and each request's grammar wait (Timings.grammar_wait_s). With affinity a schema should
compile about once; round robin, about once per replica.

Fair to both: every replica first compiles a schema of the same shape (so the first JSON-schema
compile of a fresh process is paid by neither routing), and with --rounds > 1 the two routings
take turns going first. With 96 requests "p99" is the slowest one, so the maximum of each round
is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from formwork_client import Client, json_schema

from service.cluster import Cluster
from service.envoy_config import EnvoySettings

LIGHT_SERVE_ARGS = ("--max-num-seqs", "8", "--num-blocks", "256", "--max-model-len", "512", "--threads", "1")


def burst_schema(salt: str, index: int) -> dict:
    """A schema no replica has seen: its property names carry `salt`."""
    return {"type": "object", "additionalProperties": False,
            "required": [f"name_{salt}_{index}", "year", "tags"],
            "properties": {f"name_{salt}_{index}": {"type": "string", "maxLength": 20},
                           "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                           "kind": {"enum": ["book", "film", "song", f"other-{index}"]},
                           "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,8}$"},
                                    "maxItems": 3},
                           "score": {"type": "number"}}}


def warm_up(cluster: Cluster, salt: str, max_tokens: int) -> None:
    """One request of a burst-shaped schema to each replica directly (not through Envoy)."""
    for replica in cluster.replicas:
        with Client(replica.address, timeout=600) as client:
            client.generate(messages=[{"role": "user", "content": "Describe a work of art as JSON."}],
                            constraint=json_schema(burst_schema(f"w{salt}", 0)), max_tokens=max_tokens,
                            temperature=0)


def num_compiles(cluster: Cluster) -> list[int]:
    counts = []
    for replica in cluster.replicas:
        with Client(replica.address, timeout=60) as client:
            counts.append(client.model_info().load.num_grammar_compiles)
    return counts


def run_burst(cluster: Cluster, salt: str, num_schemas: int, repeats: int, concurrency: int,
              max_tokens: int) -> dict:
    """Every schema `repeats` times in a shuffled order (in schema order, round robin over an even
    number of replicas would send each schema to one replica by accident), `concurrency` at once."""
    before = num_compiles(cluster)
    schemas = [burst_schema(salt, i) for i in range(num_schemas)]
    requests = [schemas[i % num_schemas] for i in range(num_schemas * repeats)]
    random.Random(0).shuffle(requests)
    with Client(cluster.address, timeout=600) as client:
        def one(schema: dict) -> float:
            response = client.generate(messages=[{"role": "user", "content": "Describe a work of art as JSON."}],
                                       constraint=json_schema(schema), max_tokens=max_tokens, temperature=0)
            return response.timings.grammar_wait_s

        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            waits = sorted(pool.map(one, requests))
        elapsed_s = time.monotonic() - started
    compiles = [a - b for a, b in zip(num_compiles(cluster), before)]
    return {"num_requests": len(requests), "num_schemas": num_schemas, "compiles_per_replica": compiles,
            "num_compiles": sum(compiles), "compiles_per_schema": sum(compiles) / num_schemas,
            "grammar_wait_p50_s": waits[len(waits) // 2],
            "grammar_wait_p99_s": waits[min(len(waits) - 1, int(0.99 * len(waits)))],
            "grammar_wait_max_s": waits[-1], "wall_s": elapsed_s}


def run(args: argparse.Namespace) -> int:
    results: dict[str, list[dict]] = {"affinity": [], "round_robin": []}
    settings = EnvoySettings(health_interval_s=1.0)
    with Cluster(args.replicas, [*LIGHT_SERVE_ARGS, *args.serve_args], settings=settings) as cluster:
        cluster.start()
        salt = f"{time.time_ns() % 10**9:x}"  # short: the names are part of the shortest output
        warm_up(cluster, salt, args.max_tokens)
        for round_index in range(args.rounds):
            order = ("affinity", "round_robin") if round_index % 2 == 0 else ("round_robin", "affinity")
            for balancing in order:
                cluster.restart_envoy(EnvoySettings(health_interval_s=1.0, balancing=balancing))
                result = run_burst(cluster, f"{balancing[0]}{round_index}{salt}", args.schemas, args.repeats,
                                   args.concurrency, args.max_tokens)
                results[balancing].append(result)
                print(f"round {round_index + 1} {balancing:12s} {json.dumps(result)}", flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=2))
    return 0


def add_affinity_parser(which: argparse._SubParsersAction) -> None:
    parser = which.add_parser("affinity", help="grammar compiles behind Envoy: by constraint key vs round robin",
                              description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--schemas", type=int, default=8, help="new schemas in the burst (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=6, help="requests per schema (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="per request; at least the schema's shortest answer (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="bursts per routing, the two taking turns to go first (default: %(default)s)")
    parser.add_argument("--output", help="write the figures as JSON here")
    parser.add_argument("serve_args", nargs="*", help="more `formwork serve` options for every replica, after --")
    parser.set_defaults(func=run)
