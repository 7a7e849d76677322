"""The documents of `formwork extract`: a JSONL file (one object a line, its text and id in named
fields) or a folder of .txt files (the file name, without .txt, is the id)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Document:
    line_number: int  # 1-based: its line in the JSONL file, or its place among the folder's files
    doc_id: str
    text: str


@dataclass(frozen=True)
class BadDocument:
    line_number: int
    doc_id: str | None
    code: str
    message: str


class DocumentsError(Exception):
    """The documents cannot be read at all (missing, unreadable, an empty folder)."""


def read_documents(path: str | Path, text_field: str = "text", id_field: str = "id") -> list[Document | BadDocument]:
    path = Path(path)
    if path.is_dir():
        return _folder(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DocumentsError(f"cannot read {path}: {e.strerror}") from None
    documents: list[Document | BadDocument] = []
    for index, line in enumerate(raw.split(b"\n")):
        if line.strip():
            documents.append(_document(line, index + 1, text_field, id_field))
    return documents


def _folder(folder: Path) -> list[Document | BadDocument]:
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        raise DocumentsError(f"{folder} holds no .txt files")
    documents: list[Document | BadDocument] = []
    for number, file in enumerate(files, 1):
        doc_id = file.relative_to(folder).with_suffix("").as_posix()
        try:
            documents.append(Document(number, doc_id, file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            documents.append(BadDocument(number, doc_id, "unreadable_document", f"cannot read {file}: {e}"))
    return documents


def _document(line: bytes, line_number: int, text_field: str, id_field: str) -> Document | BadDocument:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return BadDocument(line_number, None, "invalid_json_line", f"line {line_number} is not valid JSON: {e}")
    if not isinstance(record, dict):
        return BadDocument(line_number, None, "invalid_document", f"line {line_number} is not a JSON object")
    doc_id = record.get(id_field)
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        return BadDocument(line_number, None, "missing_id",
                           f"line {line_number} has no {id_field!r} (a string or integer id; --id-field names it)")
    text = record.get(text_field)
    if not isinstance(text, str):
        return BadDocument(line_number, doc_id, "missing_text",
                           f"line {line_number} has no {text_field!r} string (--text-field names it)")
    return Document(line_number, doc_id, text)
