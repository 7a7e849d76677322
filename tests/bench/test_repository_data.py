"""The repository carries the data its tests and benchmarks read, and names no path outside itself."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.datasets import (DATA_DIR, JSON_EXTRACTION_FILE, SAMPLE_MAX_BYTES, SUBSETS, TEST_SUITE_DIR,
                            jsonschemabench_dir, schema_bytes)

ROOT = Path(__file__).resolve().parents[2]

# An absolute path into a machine's own folders (a workspace, a home), or the workspace folder
# beside the project; not after a host name or another path segment (URLs, /usr/lib/..., ~/...).
OUTSIDE = re.compile(r"(?<![\w.:/~-])/(?:work|home|root|Users|mnt|srv)/[\w.-]"
                     r"|\.\./shared\b|\bshared/data\b|[\"']shared[\"']\s*/")
# A relative path (dot-dot segments) that climbs out of the repository from the file it is written in.
RELATIVE = re.compile(r"(?<![\w.])((?:\.\./)+)[\w.-]")


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink():
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary
            files.append(path)
    return files


def outside_references(path: Path, text: str) -> list[str]:
    found = [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    for m in RELATIVE.finditer(text):
        climbs = m.group(1).count("../")
        target = path.parent
        for _ in range(climbs):
            target = target.parent
        if not target.is_relative_to(ROOT):
            found.append(f"{path.relative_to(ROOT)}: {m.group(0)!r} leaves the repository")
    return found


def test_no_tracked_file_references_a_path_outside_the_repository():
    files = tracked_text_files()
    assert len(files) > 50
    found = [line for path in files if path.name != "package-lock.json"
             for line in outside_references(path, path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_path_check_catches_each_kind_of_escape(tmp_path):
    probe = ROOT / "docs" / "probe.md"
    # spelled in parts, so that this file names no such path itself
    up, ws, root, slash = "..", "sha" + "red", "wo" + "rk", "/"
    escapes = [slash + root + slash + ws + "/data/x", up + slash + ws + "/data", 'Path("a") / "' + ws + '" / "data"',
               "see " + up + slash + up + "/other.md", "/ho" + "me/someone/model"]
    for text in escapes:
        assert outside_references(probe, text), text
    for fine in ["https://example.org/home/page", "~/.cache/formwork", "/usr/lib/x", "../README.md",
                 "/tmp/formwork-gpu-check", "shared by every layer"]:
        assert outside_references(probe, fine) == [], fine


def test_the_jsonschemabench_sample_covers_every_subset_by_its_rule():
    folder = jsonschemabench_dir()
    assert folder.is_relative_to(ROOT)
    total = 0
    for subset in SUBSETS:
        items = [json.loads(line) for line in (folder / f"{subset}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert items, subset
        assert all(item["subset"] == subset and schema_bytes(item["schema"]) <= SAMPLE_MAX_BYTES for item in items)
        total += len(items)
    assert 300 <= total <= 600
    size = sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.is_file())
    assert size < 10 * 2**20


def test_each_carried_data_set_has_its_licence_and_source():
    for folder in (DATA_DIR / "jsonschemabench", DATA_DIR / "json-schema-test-suite"):
        assert (folder / "LICENSE").read_text(encoding="utf-8").strip()
        readme = (folder / "README.md").read_text(encoding="utf-8")
        assert "commit" in readme and "icence" in readme
    assert len(list(TEST_SUITE_DIR.glob("*.json"))) == 46
    assert JSON_EXTRACTION_FILE.is_file()


def test_a_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no JSONSchemaBench folder"):
        jsonschemabench_dir(tmp_path / "absent")


def test_load_schemas_reads_another_copy_given_with_data(tmp_path):
    from bench.coverage import load_schemas
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    (tmp_path / "Github_easy.jsonl").write_text(json.dumps({"id": "x1", "subset": "Github_easy", "schema": schema})
                                                + "\n", encoding="utf-8")
    assert load_schemas(["Github_easy"], limit=5, data=tmp_path) == [("Github_easy", "x1", schema)]


def test_keyword_survey_defaults_to_the_carried_suite():
    from bench.keyword_survey import DEFAULT_SUITE
    assert DEFAULT_SUITE.resolve() == TEST_SUITE_DIR.resolve()


@pytest.mark.parametrize("name, schema_of", [("person_extraction.jsonl", lambda item: item["schema"]),
                                             ("function_calls.jsonl", lambda item: item["tool"]["parameters"])])
def test_the_accuracy_sets_are_large_enough_and_their_answers_fit_their_schemas(name, schema_of):
    """400 items: a paired difference's standard error near 0.007-0.009, under the 0.01 a quantized
    model must keep to; and every expected answer valid (optional parameters only where the request
    states them: the scoring reads only the expected fields)."""
    import jsonschema
    items = [json.loads(line) for line in (DATA_DIR / name).read_text(encoding="utf-8").splitlines()]
    assert len(items) >= 400 and len({item["id"] for item in items}) == len(items)
    for item in items:
        assert jsonschema.Draft202012Validator(schema_of(item)).is_valid(item["expected"]), item["id"]
