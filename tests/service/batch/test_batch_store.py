"""The batch store (files and batches in SQLite under a data directory) and the batch statuses."""
from __future__ import annotations

import pytest

from service.batch.batch_status import CANCELLABLE, BatchStatus
from service.batch.store import BatchStore, DataDirInUse, RequestCounts

DAY_S = 24 * 3600


@pytest.fixture
def store(tmp_path):
    opened = BatchStore(tmp_path / "data")
    yield opened
    opened.close()


def add_batch(store: BatchStore, input_file_id: str = "file-x", now: int = 1000):
    return store.add_batch("/v1/chat/completions", input_file_id, "24h", DAY_S, {"job": "test"}, now=now)


# ---- statuses -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "allowed"), [
    (BatchStatus.VALIDATING, {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}),
    (BatchStatus.IN_PROGRESS, {BatchStatus.FINALIZING, BatchStatus.EXPIRED, BatchStatus.CANCELLING}),
    (BatchStatus.FINALIZING, {BatchStatus.COMPLETED}),
    (BatchStatus.CANCELLING, {BatchStatus.CANCELLED}),
    (BatchStatus.COMPLETED, set()), (BatchStatus.FAILED, set()), (BatchStatus.EXPIRED, set()),
    (BatchStatus.CANCELLED, set()),
])
def test_each_status_moves_only_to_its_next_ones(start, allowed):
    for to in BatchStatus:
        if to in allowed:
            start.check_move(to)
        else:
            with pytest.raises(ValueError, match=f"cannot go from {start.value} to {to.value}"):
                start.check_move(to)
    assert start.is_finished == (not allowed)


def test_only_validating_and_in_progress_batches_are_cancellable():
    assert CANCELLABLE == {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS}
    assert BatchStatus.VALIDATING.timestamp_field is None
    assert BatchStatus.CANCELLING.timestamp_field == "cancelling_at"


# ---- files --------------------------------------------------------------------------------------


def test_a_file_is_stored_read_listed_and_deleted(store):
    first = store.add_file(b'{"a": 1}\n', "in.jsonl", "batch", now=10)
    assert first.id.startswith("file-") and first.bytes == 9 and first.filename == "in.jsonl"
    assert store.file(first.id) == first
    assert store.file_path(first.id).read_bytes() == b'{"a": 1}\n'
    second = store.add_file(b"x", "b.jsonl", "batch", now=11)
    third = store.add_file(b"y", "out.jsonl", "batch_output", now=12)
    newest = store.files(limit=2)
    assert [f.id for f in newest.items] == [third.id, second.id] and newest.has_more
    rest = store.files(limit=2, after=second.id)
    assert [f.id for f in rest.items] == [first.id] and not rest.has_more
    assert [f.id for f in store.files(limit=10, newest_first=False).items] == [first.id, second.id, third.id]
    assert [f.id for f in store.files(limit=10, purpose="batch_output").items] == [third.id]
    with pytest.raises(KeyError):
        store.files(limit=10, after="file-unknown")
    assert store.delete_file(second.id)
    assert store.file(second.id) is None and not store.file_path(second.id).exists()
    assert not store.delete_file(second.id)


def test_an_unfinished_batch_keeps_its_input_file(store):
    upload = store.add_file(b"{}\n", "in.jsonl", "batch")
    batch = add_batch(store, upload.id)
    with pytest.raises(ValueError, match=f"is the input of the batch {batch.id}, which is validating"):
        store.delete_file(upload.id)
    store.move(batch.id, BatchStatus.FAILED, errors=[{"code": "empty_file", "message": "m", "param": None,
                                                      "line": None}])
    assert store.delete_file(upload.id)


# ---- batches ------------------------------------------------------------------------------------


def test_a_batch_moves_through_its_statuses_with_timestamps(store):
    batch = add_batch(store, now=1000)
    assert batch.id.startswith("batch_") and batch.status is BatchStatus.VALIDATING
    assert batch.created_at == 1000 and batch.expires_at == 1000 + DAY_S and batch.timestamps == {}
    assert batch.metadata == {"job": "test"} and batch.request_counts == RequestCounts()
    running = store.move(batch.id, BatchStatus.IN_PROGRESS, now=1001, num_total=3)
    assert running.timestamps == {"in_progress_at": 1001} and running.request_counts == RequestCounts(3, 0, 0)
    store.set_counts(batch.id, 2, 1)
    assert store.batch(batch.id).request_counts == RequestCounts(3, 2, 1)
    with pytest.raises(ValueError, match="cannot go from in_progress to completed"):
        store.move(batch.id, BatchStatus.COMPLETED)
    assert store.batch(batch.id).status is BatchStatus.IN_PROGRESS  # the refused move changed nothing
    store.move(batch.id, BatchStatus.FINALIZING, now=1002)
    store.results_path(batch.id).write_bytes(b"answers\n")
    output = store.staged_path()
    output.write_bytes(b'{"ok": 1}\n')
    done = store.finish(batch.id, BatchStatus.COMPLETED, output, None, RequestCounts(3, 3, 0),
                        usage={"total_tokens": 12}, now=1003)
    assert done.usage == {"total_tokens": 12}
    assert done.status is BatchStatus.COMPLETED and done.error_file_id is None
    assert done.timestamps == {"in_progress_at": 1001, "finalizing_at": 1002, "completed_at": 1003}
    assert done.request_counts == RequestCounts(3, 3, 0)
    output_file = store.file(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.filename == f"{batch.id}_output.jsonl"
    assert store.file_path(output_file.id).read_bytes() == b'{"ok": 1}\n'
    assert not store.results_path(batch.id).exists() and not output.exists()


def test_failed_validation_keeps_its_errors(store):
    batch = add_batch(store)
    errors = [{"code": "invalid_json_line", "message": "line 2 is not valid JSON", "param": None, "line": 2}]
    failed = store.move(batch.id, BatchStatus.FAILED, now=1500, errors=errors)
    assert failed.errors == errors and failed.timestamps == {"failed_at": 1500}


def test_batches_list_newest_first_and_unfinished_oldest_first(store):
    batches = [add_batch(store, now=1000 + i) for i in range(4)]
    store.move(batches[1].id, BatchStatus.FAILED)
    page = store.batches(limit=3)
    assert [b.id for b in page.items] == [b.id for b in reversed(batches)][:3] and page.has_more
    assert [b.id for b in store.batches(limit=3, after=batches[1].id).items] == [batches[0].id]
    assert [b.id for b in store.unfinished_batches()] == [batches[0].id, batches[2].id, batches[3].id]


def test_everything_survives_a_reopen_and_half_written_files_are_swept(tmp_path):
    store = BatchStore(tmp_path)
    upload = store.add_file(b"{}\n", "in.jsonl", "batch")
    batch = add_batch(store, upload.id)
    store.move(batch.id, BatchStatus.IN_PROGRESS, num_total=1)
    store.close()
    # a process killed between moving a file in and committing its row, and one killed mid-write
    (tmp_path / "files" / "file-orphan").write_bytes(b"x")
    (tmp_path / "staging" / "abc.part").write_bytes(b"y")
    reopened = BatchStore(tmp_path)
    try:
        assert reopened.file(upload.id) == upload
        assert reopened.batch(batch.id).status is BatchStatus.IN_PROGRESS
        assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [upload.id]
        assert not list((tmp_path / "staging").iterdir())
    finally:
        reopened.close()


def test_one_server_a_data_directory(tmp_path):
    first = BatchStore(tmp_path)
    with pytest.raises(DataDirInUse, match="in use by another server"):
        BatchStore(tmp_path)
    first.close()
    BatchStore(tmp_path).close()
