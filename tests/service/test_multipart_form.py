"""The multipart/form-data reader behind file uploads."""
from __future__ import annotations

import httpx
import pytest

from service.http.multipart_form import parse_multipart


def encoded(files: dict, data: dict) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://test/", files=files, data=data)
    return request.headers["content-type"], request.read()


def test_fields_and_files_come_back_byte_for_byte():
    content = b'{"a": 1}\r\n\r\n--not-the-boundary\n\x00\xff'
    content_type, body = encoded({"file": ("in.jsonl", content)}, {"purpose": "batch"})
    form = parse_multipart(content_type, body)
    assert form["file"].content == content and form["file"].filename == "in.jsonl"
    assert form["purpose"].content == b"batch" and form["purpose"].filename is None


def test_a_non_ascii_filename_is_read():
    content_type, body = encoded({"file": ("données.jsonl", b"x")}, {})
    assert parse_multipart(content_type, body)["file"].filename == "données.jsonl"


@pytest.mark.parametrize(("content_type", "body", "message"), [
    ("application/json", b"{}", "must be multipart/form-data, got application/json"),
    (None, b"", "got no Content-Type"),
    ("multipart/form-data", b"", "has no boundary"),
    ("multipart/form-data; boundary=xyz", b"nothing here", "its boundary is not in the body"),
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1",
     "ends before its closing boundary"),
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nX-Other: 1\r\n\r\n1\r\n--xyz--\r\n",
     "no 'Content-Disposition: form-data; name=...'"),
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n--xyz--\r\n",
     "has no blank line after its headers"),
])
def test_a_broken_form_is_refused_naming_the_problem(content_type, body, message):
    with pytest.raises(ValueError, match=message):
        parse_multipart(content_type, body)
