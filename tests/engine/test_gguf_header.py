"""The GGUF header reader against the gguf package's reader: the same architecture and tensors."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.gguf_header import read_gguf_header
from engine.model_files import default_gguf_path


def assert_same_as_gguf_package(path: Path) -> None:
    architecture, tensors = read_gguf_header(path)
    reader = gguf.GGUFReader(path)
    assert architecture == bytes(reader.fields[gguf.Keys.General.ARCHITECTURE].parts[-1]).decode()
    assert [(t.name, t.tensor_type, t.shape, t.data_offset, t.n_bytes) for t in tensors] == [
        (t.name, t.tensor_type, tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors]


def test_the_packaged_model_reads_as_the_gguf_package_reads_it():
    assert_same_as_gguf_package(default_gguf_path())


def write_file(path: Path, alignment: int | None = None) -> Path:
    """Every kind of metadata value, arrays of strings and of arrays among them, and tensors of a
    float and a quantized type."""
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.data_alignment = alignment
        writer.add_uint32("general.alignment", alignment)
    writer.add_uint8("u8", 7)
    writer.add_int16("i16", -3)
    writer.add_float64("f64", 0.5)
    writer.add_bool("flag", True)
    writer.add_string("text", "héllo")
    writer.add_array("words", ["a", "bc", ""])
    writer.add_array("numbers", [1, 2, 3])
    writer.add_array("nested", [[1, 2], ["x"]])
    writer.add_tensor("norm.weight", np.ones(24, dtype=np.float32))
    rows = np.zeros((4, 64 // 32 * 34), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_up.weight", rows, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_metadata_type_is_walked(tmp_path, alignment):
    path = write_file(tmp_path / "every-type.gguf", alignment)
    assert_same_as_gguf_package(path)
    _, tensors = read_gguf_header(path)
    assert [(t.name, t.shape, t.n_bytes) for t in tensors] == [("norm.weight", (24,), 96),
                                                                ("blk.0.ffn_up.weight", (64, 4), 4 * 68)]


def test_a_file_that_is_not_gguf_or_cut_short_is_refused_naming_it(tmp_path):
    whole = write_file(tmp_path / "whole.gguf").read_bytes()
    cases = {"empty.gguf": b"", "text.gguf": b"not a model at all", "header.gguf": whole[:40],
             "data.gguf": whole[:-64]}
    reasons = {"empty.gguf": "empty", "text.gguf": "does not start with GGUF", "header.gguf": "truncated",
               "data.gguf": "runs past its end"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=f"cannot read the GGUF file .*{name}.*{reasons[name]}"):
            read_gguf_header(tmp_path / name)
