"""Where the data of the tests and benchmarks lives: `bench/data/`, inside the repository.

    python -m bench.datasets sample --source DIR   # rewrite the carried JSONSchemaBench sample from a full copy

The project carries a JSONSchemaBench sample (every subset) and the JSON-Schema-Test-Suite's draft
2020-12 files; bench/data/README.md says where each came from. Commands that read them take
`--data DIR` to point at a larger copy laid out the same way (one `<Subset>.jsonl` per subset).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
JSONSCHEMABENCH_DIR = DATA_DIR / "jsonschemabench"
TEST_SUITE_DIR = DATA_DIR / "json-schema-test-suite" / "draft2020-12"
JSON_EXTRACTION_FILE = DATA_DIR / "json_extraction.jsonl"

SUBSETS = ("Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
           "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost")
# The sample's rule: the first SAMPLE_PER_SUBSET schemas of each subset file, in file order, whose
# compact JSON is at most SAMPLE_MAX_BYTES.
SAMPLE_PER_SUBSET = 50
SAMPLE_MAX_BYTES = 20_000


def jsonschemabench_dir(data: Path | str | None = None) -> Path:
    """The folder of `<Subset>.jsonl` files: `data` when given, else the carried sample."""
    folder = Path(data) if data is not None else JSONSCHEMABENCH_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"no JSONSchemaBench folder at {folder} (expected one <Subset>.jsonl per subset)")
    return folder


def schema_bytes(schema: object) -> int:
    return len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())


def write_sample(source: Path, target: Path = JSONSCHEMABENCH_DIR, per_subset: int = SAMPLE_PER_SUBSET,
                 max_bytes: int = SAMPLE_MAX_BYTES) -> dict[str, int]:
    """Copy the sample's lines (unchanged) from a full copy at `source`; {subset: schemas written}."""
    target.mkdir(parents=True, exist_ok=True)
    written = {}
    for subset in SUBSETS:
        kept = []
        with open(source / f"{subset}.jsonl", encoding="utf-8") as f:
            for line in f:
                if line.strip() and schema_bytes(json.loads(line)["schema"]) <= max_bytes:
                    kept.append(line if line.endswith("\n") else line + "\n")
                    if len(kept) == per_subset:
                        break
        (target / f"{subset}.jsonl").write_text("".join(kept), encoding="utf-8")
        written[subset] = len(kept)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser("sample", help="rewrite bench/data/jsonschemabench from a full copy")
    sample.add_argument("--source", type=Path, required=True, help="a folder of <Subset>.jsonl (the full set)")
    args = parser.parse_args()
    for subset, count in write_sample(args.source).items():
        print(f"{subset}: {count}")


if __name__ == "__main__":
    main()
