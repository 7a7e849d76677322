"""SchemaWorker: the Python part of a schema's compile in a worker process gives what it gives in
the engine's process (results, errors and their messages), and a worker that dies fails only the
call it served."""
from __future__ import annotations

import json
import os
import time

import pytest
from grammar_factories import make_backend, make_constraint, make_llguidance_backend

from bench.datasets import jsonschemabench_dir
from grammar.backend import GrammarError, UnsupportedError, run_here
from grammar.compiler import GrammarCompiler
from grammar.config import GrammarConfig
from grammar.llguidance import prepared_schema
from grammar.schema_worker import SchemaWorker, SchemaWorkerCrashed
from grammar.xgrammar import json_grammar

NUM_SCHEMAS = 12
READY_TIMEOUT_S = 120.0  # a new worker imports xgrammar (and torch): seconds, more on a loaded machine
CONFIG = GrammarConfig()


def ready_worker(min_spec_chars: int = 0) -> SchemaWorker:
    """A worker that has started and answered a call (the first calls run here while it starts)."""
    worker = SchemaWorker(min_spec_chars=min_spec_chars)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while worker.num_calls == 0:
        assert time.monotonic() < deadline, "the schema worker did not start"
        worker.run(json_grammar.prepare, make_constraint(spec={"type": "integer"}), CONFIG, num_chars=1 << 30)
        time.sleep(0.05)
    return worker


@pytest.fixture(scope="module")
def worker():
    worker = ready_worker()
    yield worker
    worker.shutdown()


def sample_schemas() -> list[tuple[str, dict]]:
    """The first schemas of each carried JSONSchemaBench subset, the same ones every run."""
    out = []
    for path in sorted(jsonschemabench_dir().glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out += [(r["id"], r["schema"]) for r in sorted(rows, key=lambda r: r["id"])[:2]]
    return out[:NUM_SCHEMAS]


def outcome(fn, *args):
    """fn's result, or its exception's type and message."""
    try:
        return fn(*args)
    except GrammarError as e:
        return type(e), str(e)


@pytest.mark.parametrize("schema_id,schema", sample_schemas())
@pytest.mark.parametrize("strict", [True, False])
def test_the_worker_prepares_a_schema_as_this_process_does(worker, schema_id, schema, strict):
    constraint = make_constraint(spec=schema, strict=strict)
    for fn in (json_grammar.prepare, prepared_schema.prepare):
        calls = worker.num_calls
        assert outcome(worker.run, fn, constraint, CONFIG) == outcome(fn, constraint, CONFIG)
        assert worker.num_calls == calls + 1  # it ran there, not here


@pytest.mark.parametrize("schema,error,message", [
    ({"type": 3}, GrammarError, '"type" at / (the root) must be a type name'),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "contains": {"not": {}}},
     UnsupportedError, None),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, GrammarError,
     "accepts no output of finite length"),
])
def test_errors_come_back_as_the_same_type_with_the_same_message(worker, schema, error, message):
    constraint = make_constraint(spec=schema, strict=True)
    there = outcome(worker.run, json_grammar.prepare, constraint, CONFIG)
    assert there == outcome(json_grammar.prepare, constraint, CONFIG)
    assert there[0] is error and (message is None or message in there[1])


def test_a_worker_that_dies_fails_that_call_and_the_next_call_starts_a_new_one():
    worker = ready_worker()
    pid = worker.pid
    with pytest.raises(SchemaWorkerCrashed, match=r"exited \(code 7\)"):
        worker.run(os._exit, 7, num_chars=1 << 30)
    assert worker.num_crashes == 1 and worker.pid is None
    constraint = make_constraint(spec={"type": "string"})
    assert worker.run(json_grammar.prepare, constraint, CONFIG, num_chars=1 << 30) == json_grammar.prepare(
        constraint, CONFIG)  # here, while a new worker starts
    deadline = time.monotonic() + READY_TIMEOUT_S
    calls = worker.num_calls
    while worker.num_calls == calls:
        assert time.monotonic() < deadline, "no new worker started"
        worker.run(json_grammar.prepare, constraint, CONFIG, num_chars=1 << 30)
        time.sleep(0.05)
    assert worker.pid not in (None, pid)
    worker.shutdown()


def test_a_small_spec_and_a_call_while_busy_run_here():
    worker = SchemaWorker(min_spec_chars=100)
    constraint = make_constraint(spec={"type": "string"})
    assert worker.run(json_grammar.prepare, constraint, CONFIG, num_chars=99) == json_grammar.prepare(
        constraint, CONFIG)
    assert worker.pid is None  # never started for it
    worker.shutdown()


def test_a_compiler_whose_worker_dies_fails_that_compile_and_serves_on():
    """The engine's view: the compile the worker died in fails with a GrammarError naming the
    crash; the next compiles (here while a new worker starts) succeed on both backends."""
    from grammar.selection import SelectingBackend

    config = GrammarConfig(idle_compiles=False)
    backend = SelectingBackend({"xgrammar": make_backend(), "llguidance": make_llguidance_backend()}, config)
    compiler = GrammarCompiler(backend, config)
    worker = compiler._schema_worker
    assert worker is not None
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while worker.num_calls == 0:
            assert time.monotonic() < deadline, "the schema worker did not start"
            worker.run(len, "ready?", num_chars=1 << 30)
            time.sleep(0.05)
        backend.use_schema_runner(lambda fn, *args, num_chars=0: worker.run(os._exit, 9, num_chars=num_chars))
        big = {"type": "object", "properties": {f"field_{n:03d}": {"type": "integer"} for n in range(300)}}
        with pytest.raises(GrammarError, match=r"internal error SchemaWorkerCrashed: the schema worker process "
                                               r"exited \(code 9\)"):
            compiler.compile_sync(make_constraint(spec=big, grammar_backend="xgrammar"))
        assert compiler.failures == {"xgrammar": {"internal": 1}}
        backend.use_schema_runner(worker.run)
        for name in ("xgrammar", "llguidance"):
            compiled, _, _ = compiler.compile_sync(make_constraint(spec={**big, "title": name}, grammar_backend=name))
            assert compiled.backend_name == name
    finally:
        compiler.shutdown()
        backend.use_schema_runner(run_here)  # the backends are shared with other tests
