"""`formwork extract`: one JSON object per document, constrained by a JSON Schema, as a job.

    formwork extract --schema SCHEMA.json --input DOCS.jsonl|FOLDER --output OUT.jsonl
                     [--instructions TEXT] [--text-field text] [--id-field id] [--max-tokens N]
                     [engine options] [--address ...] [--concurrency N]

Each document becomes a chat completion (the instructions as the system message, shared by every
request so the engine's prefix cache holds them once; the document as the user message), answered
greedily under the schema. One output record per document:

    {"id": "doc-1", "object": {...}, "usage": {"prompt_tokens": 312, "completion_tokens": 41}}
    {"id": "doc-2", "error": {"code": "invalid_output", "message": "..."}, "usage": {...}}

Resumable like `formwork batch`: run again, it skips every id already in the output.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from service.batch.lines import LineError, LineKey, RequestLine, with_unique_ids
from service.batch.runner import RecordFormat
from service.batch_cli.documents import BadDocument, Document, DocumentsError, read_documents
from service.batch_cli.job import EXIT_USAGE, add_executor_args, run_job

DEFAULT_INSTRUCTIONS = ("Extract from the user's document the information that the JSON schema asks for. Use only "
                        "what the document says.")


def add_extract_parser(subparsers: argparse._SubParsersAction,
                       add_engine_args: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    parser = subparsers.add_parser(
        "extract", help="extract one JSON object per document under a JSON Schema (resumable)",
        description="Extract one JSON object matching SCHEMA from each document of INPUT into OUTPUT (one record "
                    "per document: id, object or error, usage). Resumable: run again, it skips every id already "
                    "in OUTPUT.")
    parser.add_argument("--schema", required=True, help="the JSON Schema of one extraction (a JSON file)")
    parser.add_argument("--input", required=True,
                        help="the documents: a JSONL file (one object a line) or a folder of .txt files")
    parser.add_argument("--output", required=True, help="the records (JSONL), appended to and resumed")
    parser.add_argument("--instructions", default=DEFAULT_INSTRUCTIONS,
                        help="the system message before each document (default: a generic extraction prompt)")
    parser.add_argument("--text-field", default="text", help="JSONL input: the field with the document's text "
                                                              "(default: %(default)s)")
    parser.add_argument("--id-field", default="id", help="JSONL input: the field with the document's id "
                                                          "(default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="most tokens of one extraction (default: %(default)s)")
    add_executor_args(parser, add_engine_args)
    parser.set_defaults(func=run_extract)


def run_extract(args: argparse.Namespace) -> int:
    try:
        with open(args.schema, "rb") as f:
            schema = json.load(f)
        documents = read_documents(args.input, args.text_field, args.id_field)
    except (OSError, ValueError, DocumentsError) as e:
        print(f"formwork extract: error: {_reason(e, args.schema)}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(schema, dict):
        print(f"formwork extract: error: {args.schema} must hold a JSON Schema object, not {type(schema).__name__}",
              file=sys.stderr)
        return EXIT_USAGE
    lines = extraction_lines(documents, schema, args.instructions, args.max_tokens)
    return run_job(args, "extract", lines, args.output, EXTRACTION_RECORDS, input_path=args.input)


def _reason(error: Exception, schema_path: str) -> str:
    if isinstance(error, OSError):
        return f"cannot read {error.filename or schema_path}: {error.strerror}"
    if isinstance(error, ValueError):
        return f"{schema_path} is not valid JSON: {error}"
    return str(error)


def extraction_lines(documents: list[Document | BadDocument], schema: dict[str, Any], instructions: str,
                     max_tokens: int) -> list[RequestLine | LineError]:
    """One chat completion request per document (the document id as its custom_id)."""
    lines: list[RequestLine | LineError] = []
    for document in documents:
        if isinstance(document, BadDocument):
            lines.append(LineError(document.line_number, document.doc_id, document.code, document.message))
        else:
            lines.append(RequestLine(document.line_number, document.doc_id, "/v1/chat/completions",
                                     extraction_body(document.text, schema, instructions, max_tokens)))
    return with_unique_ids(lines)


def extraction_body(text: str, schema: dict[str, Any], instructions: str, max_tokens: int) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": instructions}, {"role": "user", "content": text}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "extraction", "schema": schema, "strict": True}},
            "temperature": 0, "max_tokens": max_tokens}


def extraction_record(line: RequestLine, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A document's record from its chat completion: the parsed object, or why there is none."""
    usage = body.get("usage") or {}
    counts = {"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)}
    if status != 200:
        error = body.get("error") or {}
        return {"id": line.custom_id, "error": {"code": error.get("code") or f"http_{status}",
                                                "message": error.get("message") or f"the answer's status is {status}"},
                "usage": counts}
    choice = body["choices"][0]
    content = choice["message"].get("content") or ""
    try:
        extracted = json.loads(content)
    except ValueError:
        return {"id": line.custom_id, "error": {
            "code": "invalid_output",
            "message": f"the answer is not complete JSON (finish_reason {choice.get('finish_reason')!r}; raise "
                       f"--max-tokens if it is 'length'): {content[:200]!r}"}, "usage": counts}
    return {"id": line.custom_id, "object": extracted, "usage": counts}


def extraction_error(error: LineError) -> dict[str, Any]:
    record: dict[str, Any] = {"id": error.custom_id, "error": {"code": error.code, "message": error.message}}
    if error.custom_id is None:
        record["line"] = error.line_number
    return record


def extraction_key(record: dict[str, Any]) -> LineKey | None:
    doc_id = record.get("id")
    if isinstance(doc_id, str):
        return doc_id
    line = record.get("line")
    return line if isinstance(line, int) else None


EXTRACTION_RECORDS = RecordFormat(extraction_record, extraction_error, extraction_key)
