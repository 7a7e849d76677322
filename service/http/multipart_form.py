"""A multipart/form-data body (RFC 7578) read into its fields: what a file upload sends.

Parsed here, over the whole body in memory (its size is checked before), so that the server
needs no form-parsing package.
"""
from __future__ import annotations

from dataclasses import dataclass
from email.message import EmailMessage


@dataclass(frozen=True)
class FormField:
    name: str
    filename: str | None  # set on a file field
    content: bytes


def parse_multipart(content_type: str | None, body: bytes) -> dict[str, FormField]:
    """name -> field (the first of a repeated name). ValueError naming what is wrong with the form."""
    header = EmailMessage()
    header["Content-Type"] = content_type or ""
    if header.get_content_type() != "multipart/form-data":
        raise ValueError(f"the body must be multipart/form-data, got {content_type or 'no Content-Type'}")
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise ValueError("the multipart/form-data Content-Type has no boundary")
    delimiter = b"--" + boundary.encode("latin-1")
    start = body.find(delimiter)
    if start < 0:
        raise ValueError("the form has no part (its boundary is not in the body)")
    fields: dict[str, FormField] = {}
    position = start + len(delimiter)
    while not body.startswith(b"--", position):  # "--" after a delimiter closes the form
        line_end = body.find(b"\r\n", position)
        following = body.find(b"\r\n" + delimiter, line_end)
        if line_end < 0 or following < 0:
            raise ValueError("the form ends before its closing boundary")
        field = _field(body[line_end + 2:following])
        fields.setdefault(field.name, field)
        position = following + 2 + len(delimiter)
    return fields


def _field(part: bytes) -> FormField:
    head, separator, content = part.partition(b"\r\n\r\n")
    if not separator:
        raise ValueError("a form part has no blank line after its headers")
    disposition = EmailMessage()
    for line in head.decode("utf-8", "replace").split("\r\n"):
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() == "content-disposition":
            disposition["Content-Disposition"] = value.strip()
    name = disposition.get_param("name", header="content-disposition")
    if not isinstance(name, str) or disposition.get_content_disposition() != "form-data":
        raise ValueError("a form part has no 'Content-Disposition: form-data; name=...' header")
    return FormField(name, disposition.get_filename(), content)
