"""The output file: whole lines appended, read back on resume, a torn last line cut off, and a
key never written twice."""
from __future__ import annotations

import json

import pytest

from service.batch.lines import output_key
from service.batch.output_file import OutputFile, OutputFileError


def line(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "response": {"status_code": 200}}).encode() + b"\n"


def test_lines_are_appended_whole_and_read_back(tmp_path):
    path = tmp_path / "out.jsonl"
    with OutputFile(path, output_key) as output:
        assert output.done == set() and output.num_torn_bytes == 0
        output.append("a", {"custom_id": "a"})
        output.append(3, {"custom_id": None, "line": 3})
        with pytest.raises(ValueError, match="'a' is already in"):
            output.append("a", {"custom_id": "a"})
    assert path.read_bytes() == b'{"custom_id":"a"}\n{"custom_id":null,"line":3}\n'
    with OutputFile(path, output_key) as resumed:
        assert resumed.done == {"a", 3}


@pytest.mark.parametrize("tail", [b'{"custom_id": "c", "resp', b"\x00\x00\x00\x00", b"\x00\x00\n"])
def test_a_torn_last_line_is_cut_off(tmp_path, tail):
    path = tmp_path / "out.jsonl"
    path.write_bytes(line("a") + line("b") + tail)
    with OutputFile(path, output_key) as output:
        assert output.done == {"a", "b"}
        assert output.num_torn_bytes == len(tail)
        output.append("c", {"custom_id": "c"})
    assert path.read_bytes() == line("a") + line("b") + b'{"custom_id":"c"}\n'.replace(b" ", b"")


@pytest.mark.parametrize(("content", "error"), [
    (b"some notes\n" + line("a"), "line 1 is not a JSON object"),
    (line("a") + b"some notes\n", "line 2 is not a JSON object"),
    (b"some notes", "ends with text that is not a JSON line"),
    (line("a") + b"[1, 2", "ends with text that is not a JSON line"),
])
def test_a_file_that_is_not_a_jobs_output_is_refused_untouched(tmp_path, content, error):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(OutputFileError, match=error):
        OutputFile(path, output_key)
    assert path.read_bytes() == content


def test_a_file_that_names_no_request_is_refused(tmp_path):
    unnamed = tmp_path / "other.jsonl"
    unnamed.write_bytes(b'{"x": 1}\n' + line("a"))
    with pytest.raises(OutputFileError, match="line 1 names no request"):
        OutputFile(unnamed, output_key)


def test_an_output_that_cannot_be_opened_says_why(tmp_path):
    with pytest.raises(OutputFileError, match="cannot open the output file"):
        OutputFile(tmp_path / "missing" / "out.jsonl", output_key)
