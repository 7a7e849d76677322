"""`formwork extract`'s pieces: documents read from JSONL or a folder, one request per document,
and its record from the answer."""
from __future__ import annotations

import json

import pytest

from service.batch.lines import LineError, RequestLine
from service.batch_cli.documents import BadDocument, Document, DocumentsError, read_documents
from service.batch_cli.extract_command import (EXTRACTION_RECORDS, extraction_lines, extraction_record)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_documents_from_jsonl_and_from_a_folder(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"key": 7, "body": "seven"}\n\n{"key": "b", "body": "bee"}\n{"body": "x"}\n{"key": "c"}\nnope\n')
    documents = read_documents(jsonl, text_field="body", id_field="key")
    assert documents[:2] == [Document(1, "7", "seven"), Document(3, "b", "bee")]
    assert [(d.doc_id, d.code) for d in documents[2:]] == [(None, "missing_id"), ("c", "missing_text"),
                                                           (None, "invalid_json_line")]
    assert all(isinstance(d, BadDocument) for d in documents[2:])
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "sub" / "b.txt").write_text("beta")
    (folder / "ignored.md").write_text("no")
    assert read_documents(folder) == [Document(1, "a", "alpha"), Document(2, "sub/b", "beta")]
    with pytest.raises(DocumentsError, match="holds no .txt files"):
        read_documents(_empty(tmp_path))
    with pytest.raises(DocumentsError, match="cannot read"):
        read_documents(tmp_path / "missing.jsonl")


def _empty(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    return empty


def test_one_request_per_document_sharing_the_instructions():
    documents = [Document(1, "a", "alpha"), Document(2, "a", "again"), BadDocument(3, None, "missing_id", "no id")]
    lines = extraction_lines(documents, SCHEMA, "Extract.", 64)
    first = lines[0]
    assert isinstance(first, RequestLine) and first.url == "/v1/chat/completions" and first.custom_id == "a"
    assert first.body["messages"] == [{"role": "system", "content": "Extract."}, {"role": "user", "content": "alpha"}]
    assert first.body["response_format"]["json_schema"]["schema"] == SCHEMA and first.body["temperature"] == 0
    assert isinstance(lines[1], LineError) and lines[1].code == "duplicate_custom_id"
    assert isinstance(lines[2], LineError) and lines[2].code == "missing_id"


def test_a_record_holds_the_object_or_why_there_is_none():
    line = RequestLine(1, "a", "/v1/chat/completions", {})
    usage = {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}

    def answer(content, reason="stop"):
        return {"choices": [{"message": {"content": content}, "finish_reason": reason}], "usage": usage}

    assert extraction_record(line, 200, answer('{"name": "Ada"}')) == {
        "id": "a", "object": {"name": "Ada"}, "usage": {"prompt_tokens": 30, "completion_tokens": 5}}
    cut = extraction_record(line, 200, answer('{"name": "Ad', "length"))
    assert cut["error"]["code"] == "invalid_output" and "'length'" in cut["error"]["message"]
    refused = extraction_record(line, 400, {"error": {"message": "schema: bad", "code": "invalid_argument"}})
    assert refused["error"] == {"code": "invalid_argument", "message": "schema: bad"}
    assert [EXTRACTION_RECORDS.key_of(r) for r in (refused, {"id": None, "line": 4}, {"x": 1})] == ["a", 4, None]
    assert json.dumps(EXTRACTION_RECORDS.error(LineError(4, None, "missing_id", "no id"))) == (
        '{"id": null, "error": {"code": "missing_id", "message": "no id"}, "line": 4}')
