"""`formwork bench accuracy`: how right the values inside constrained answers are, setting by setting.

    formwork bench accuracy [--settings compact,spaced,bounded,any,bounded:no-jf,bounded:fields]
                            [--workloads json-extraction,person,function-call] [--peers vllm,transformers]

Three extraction workloads with expected answers (bench/data/): the 60 json-extraction items
(256 tokens), 400 person paragraphs (name, age, email, city; 128 tokens) and 400 function calls
(a request and one tool's parameter schema; the expected arguments, optional parameters only when
the request states them; 128 tokens). Every setting
runs every prompt greedily in one offline batch, in the same process; a setting is a JSON
whitespace mode (grammar.backend.JSON_WHITESPACE_MODES), optionally ":no-jf" (jump-forward off),
":no-close" (closing early off: answers may be cut at max_tokens) and ":fields" (the prompt the
clients' extract() sends: the text, then "Extract <field names> ...", instead of showing the schema). Peers get the same prompt token ids and schemas.

Per workload and setting: field accuracy, exact-match share, valid / length shares, tokens per
answer; per setting, answers/s over the whole batch. An answer cut at max_tokens scores 0.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

from bench.datasets import DATA_DIR
from bench.scoring import exact_match, field_accuracy, parse_answer
from bench.workloads import extraction_prompt, load_json_extraction

WORKLOADS = ("json-extraction", "person", "function-call")
MAX_TOKENS = {"json-extraction": 256, "person": 128, "function-call": 128}
DEFAULT_SETTINGS = ("compact", "spaced", "bounded", "any", "bounded:no-jf", "bounded:fields")
CALL_SYSTEM = ("You are an assistant that calls functions. Reply with the JSON arguments of the call only, "
               "using only values stated in the user's request.")


@dataclass(frozen=True)
class Item:
    workload: str
    item_id: str
    schema: dict
    expected: dict
    messages: dict[str, list[dict]]  # prompt style ("schema" | "fields") -> chat messages


@dataclass(frozen=True)
class Setting:
    name: str
    whitespace: str
    jump_forward: bool = True
    prompt: str = "schema"
    close_early: bool = True


@dataclass
class Row:
    system: str  # "formwork" or a peer
    setting: str
    workload: str
    num_answers: int = 0
    num_valid: int = 0
    num_length: int = 0
    field_accuracy: list[float] = field(default_factory=list)
    exact: int = 0
    tokens: list[int] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)  # in field_accuracy's order

    def as_dict(self) -> dict:
        n = max(self.num_answers, 1)
        return {"system": self.system, "setting": self.setting, "workload": self.workload, "answers": self.num_answers,
                "field_accuracy": statistics.mean(self.field_accuracy) if self.field_accuracy else 0.0,
                "exact_match": self.exact / n, "valid": self.num_valid / n, "length": self.num_length / n,
                "tokens_per_answer": statistics.mean(self.tokens) if self.tokens else 0.0,
                "item_scores": dict(zip(self.item_ids, self.field_accuracy))}


def parse_setting(text: str) -> Setting:
    """"bounded", "spaced:no-jf", "bounded:fields", "compact:no-jf:fields", "bounded:no-close"."""
    from grammar.constraint import JSON_WHITESPACE_MODES
    whitespace, *flags = text.split(":")
    if whitespace not in JSON_WHITESPACE_MODES or any(f not in ("no-jf", "fields", "no-close") for f in flags):
        raise ValueError(f"unknown setting {text!r}: a whitespace mode ({', '.join(JSON_WHITESPACE_MODES)}) "
                         f"optionally followed by :no-jf, :no-close and/or :fields")
    return Setting(text, whitespace, jump_forward="no-jf" not in flags, prompt="fields" if "fields" in flags else "schema",
                   close_early="no-close" not in flags)


def _fields_prompt(schema: dict, text: str) -> list[dict]:
    from formwork_client.request import extract_prompt  # the clients' own extract() prompt
    return [{"role": "user", "content": extract_prompt(schema, text)}]


def _schema_text(schema: dict) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _read_jsonl(name: str) -> list[dict]:
    with open(DATA_DIR / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_items(workloads: list[str]) -> list[Item]:
    items = []
    if "json-extraction" in workloads:
        for raw in load_json_extraction():
            items.append(Item("json-extraction", raw["id"], raw["schema"], raw["expected"],
                              {"schema": extraction_prompt(raw), "fields": _fields_prompt(raw["schema"], raw["text"])}))
    if "person" in workloads:
        for raw in _read_jsonl("person_extraction.jsonl"):
            items.append(Item("person", raw["id"], raw["schema"], raw["expected"],
                              {"schema": extraction_prompt(raw), "fields": _fields_prompt(raw["schema"], raw["text"])}))
    if "function-call" in workloads:
        for raw in _read_jsonl("function_calls.jsonl"):
            tool, params = raw["tool"], raw["tool"]["parameters"]
            shown = {"schema": f"Parameters (JSON Schema): {_schema_text(params)}",
                     "fields": f"Parameters: {', '.join(params['properties'])}."}
            items.append(Item("function-call", raw["id"], params, raw["expected"], {
                style: [{"role": "system", "content": f"{CALL_SYSTEM}\nFunction: {tool['name']}: {tool['description']}. "
                                                      f"{text}"},
                        {"role": "user", "content": raw["request"]}]
                for style, text in shown.items()}))
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(sorted(unknown))}; expected {', '.join(WORKLOADS)}")
    return items


def score_answers(system: str, setting: str, items: list[Item], answers: list[tuple[str, str, int]]) -> list[Row]:
    """Rows per workload from (text, finish reason "stop" | "length" | ..., output tokens) per item."""
    import jsonschema
    rows: dict[str, Row] = {}
    for item, (text, finish_reason, num_tokens) in zip(items, answers):
        row = rows.setdefault(item.workload, Row(system, setting, item.workload))
        row.num_answers += 1
        row.tokens.append(num_tokens)
        row.item_ids.append(item.item_id)
        value = parse_answer(text) if finish_reason != "length" else None
        row.num_length += finish_reason == "length"
        try:
            valid = value is not None and jsonschema.Draft202012Validator(item.schema).is_valid(value)
        except jsonschema.SchemaError:
            valid = False
        row.num_valid += valid
        row.field_accuracy.append(field_accuracy(item.expected, value) if valid else 0.0)
        row.exact += valid and exact_match(item.expected, value)
    return list(rows.values())


def run_formwork(llm, items: list[Item], setting: Setting) -> tuple[list[tuple[str, str, int]], float]:
    from engine.protocol import FinishReason
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint
    prompts = [item.messages[setting.prompt] for item in items]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS[item.workload], constraint=Constraint(
        kind="json_schema", spec=json.dumps(item.schema), whitespace=setting.whitespace,
        jump_forward=setting.jump_forward, close_early=setting.close_early)) for item in items]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    answers = [(o.text, "length" if o.finish_reason == FinishReason.LENGTH else "stop", o.num_output_tokens)
               for o in outputs]
    return answers, seconds


def _warm_up(llm, items: list[Item], settings: list[Setting]) -> None:
    """Every prompt once, one token each, before any clock starts: otherwise the setting that runs
    first prefills every prompt and the ones after it find them in the prefix cache."""
    from engine.sampling_params import SamplingParams
    prompts = [item.messages[kind] for kind in sorted({s.prompt for s in settings}) for item in items]
    llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=1)] * len(prompts))


def run_peer(name: str, llm, dtype: str, items: list[Item],
             any_whitespace: bool) -> tuple[list[tuple[str, str, int]], float, str]:
    """The same prompts through a peer (bench/peers); (answers, seconds, the peer's version)."""
    from bench.peers import PEERS
    from bench.peers import run_peer as run_peer_process
    from engine.model_files import default_gguf_path
    requests = [{"id": f"{item.item_id}", "prompt_token_ids": llm.encode_prompt(item.messages["schema"]),
                 "schema": item.schema, "max_tokens": MAX_TOKENS[item.workload], "any_whitespace": any_whitespace}
                for item in items]
    concurrency = 8 if name == "transformers" else len(requests)
    payload = {"model_dir": str(llm.engine.model_dir), "gguf": str(default_gguf_path()), "threads": 2,
               "dtype": dtype, "runs": [{"name": "accuracy", "concurrency": concurrency, "requests": requests}]}
    result = run_peer_process(PEERS[name], payload, timeout_s=3600)
    run = result["runs"][0]
    by_id = {r["id"]: r for r in run["records"]}
    answers = [(by_id[r["id"]].get("text", ""), by_id[r["id"]].get("finish_reason", "stop"),
                by_id[r["id"]].get("num_output_tokens", 0)) for r in requests]
    return answers, run["wall_s"], result.get("version", name)


def print_table(rows: list[dict], throughput: dict[str, dict]) -> None:
    print(f"{'system':<12} {'setting':<22} {'workload':<16} {'n':>3} {'field acc':>9} {'exact':>6} {'valid':>6} "
          f"{'length':>6} {'tok/ans':>7}")
    for r in rows:
        print(f"{r['system']:<12} {r['setting']:<22} {r['workload']:<16} {r['answers']:>3} {r['field_accuracy']:>9.3f} "
              f"{r['exact_match']:>6.2f} {r['valid']:>6.2f} {r['length']:>6.2f} {r['tokens_per_answer']:>7.1f}")
    print(f"\n{'system / setting':<36} {'answers/s':>9} {'seconds':>8}")
    for name, t in throughput.items():
        print(f"{name:<36} {t['answers_per_s']:>9.3f} {t['seconds']:>8.1f}")


def paired_differences(rows: list[dict], baseline: list[dict]) -> list[dict]:
    """Each row's field accuracy against the baseline run's row of the same system, setting and
    workload, item by item: the mean difference, its standard error (a difference under about two
    of them is what another set of the same size could undo), how many items scored better / worse."""
    by_key = {(b["system"], b["setting"], b["workload"]): b["item_scores"] for b in baseline}
    compared = []
    for r in rows:
        before = by_key.get((r["system"], r["setting"], r["workload"]))
        if before is None:
            continue
        ids = sorted(set(before) & set(r["item_scores"]))
        diffs = [r["item_scores"][i] - before[i] for i in ids]
        if len(diffs) < 2:
            continue
        compared.append({"setting": r["setting"], "workload": r["workload"], "items": len(ids),
                         "difference": statistics.mean(diffs),
                         "standard_error": statistics.stdev(diffs) / len(diffs) ** 0.5,
                         "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)})
    return compared


def print_differences(compared: list[dict], baseline_name: str) -> None:
    print(f"\nfield accuracy against {baseline_name}, item by item")
    print(f"{'setting':<22} {'workload':<16} {'n':>3} {'difference':>10} {'std err':>7} {'better':>6} {'worse':>5}")
    for c in compared:
        print(f"{c['setting']:<22} {c['workload']:<16} {c['items']:>3} {c['difference']:>+10.4f} "
              f"{c['standard_error']:>7.4f} {c['better']:>6} {c['worse']:>5}")


def main(args, engine_config) -> int:
    from engine.llm import LLM
    settings = [parse_setting(s) for s in args.settings]
    items = load_items(args.workloads)
    llm = LLM(config=engine_config)
    rows: list[dict] = []
    throughput: dict[str, dict] = {}
    try:
        _warm_up(llm, items, settings)
        for setting in settings:
            answers, seconds = run_formwork(llm, items, setting)
            rows += [row.as_dict() for row in score_answers("formwork", setting.name, items, answers)]
            throughput[f"formwork {setting.name}"] = {"answers_per_s": len(items) / seconds, "seconds": seconds}
            print(f"formwork {setting.name}: {seconds:.1f} s", flush=True)
        for peer in args.peers:
            for any_whitespace in (True, False):
                label = "any" if any_whitespace else "compact"
                try:
                    answers, seconds, version = run_peer(peer, llm, engine_config.torch_dtype, items, any_whitespace)
                except Exception as e:  # a peer that cannot run is reported, never fatal
                    print(f"peer {peer} ({label}) skipped: {e}", flush=True)
                    break
                rows += [row.as_dict() for row in score_answers(peer, label, items, answers)]
                throughput[f"{peer} {label}"] = {"answers_per_s": len(items) / seconds, "seconds": seconds,
                                                 "version": version}
                print(f"{peer} {label}: {seconds:.1f} s ({version})", flush=True)
    finally:
        llm.shutdown()
    print_table(rows, throughput)
    if args.baseline:
        from pathlib import Path
        print_differences(paired_differences(rows, json.loads(Path(args.baseline).read_text())["rows"]),
                          args.baseline)
    if args.output:
        from pathlib import Path
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"rows": rows, "throughput": throughput}, indent=1))
    return 0

