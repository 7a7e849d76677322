"""A batch's life on the server, OpenAI's statuses and the moves between them.

    validating ─► in_progress ─► finalizing ─► completed
        │  │          │  └──────► expired        (the completion window ran out: partial results)
        │  │          └─► cancelling ─► cancelled (partial results)
        │  └────────────────┘
        └─► failed                              (the input file did not validate)

Every status but `validating` has the timestamp `<status>_at`, set when the batch enters it.
"""
from __future__ import annotations

import enum


class BatchStatus(str, enum.Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_finished(self) -> bool:
        """Nothing more happens to a finished batch."""
        return self in _FINISHED

    @property
    def timestamp_field(self) -> str | None:
        """The Batch object's field stamped when a batch enters this status (None: created_at covers it)."""
        return None if self is BatchStatus.VALIDATING else f"{self.value}_at"

    def check_move(self, to: BatchStatus) -> None:
        """Raise ValueError unless a batch may go from this status to `to`."""
        if to not in _NEXT[self]:
            raise ValueError(f"a batch cannot go from {self.value} to {to.value}")


_FINISHED = frozenset((BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED))

_NEXT: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset((BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING)),
    BatchStatus.IN_PROGRESS: frozenset((BatchStatus.FINALIZING, BatchStatus.EXPIRED, BatchStatus.CANCELLING)),
    BatchStatus.FINALIZING: frozenset((BatchStatus.COMPLETED,)),
    BatchStatus.CANCELLING: frozenset((BatchStatus.CANCELLED,)),
    BatchStatus.FAILED: frozenset(),
    BatchStatus.COMPLETED: frozenset(),
    BatchStatus.EXPIRED: frozenset(),
    BatchStatus.CANCELLED: frozenset(),
}

# a batch in one of these may be cancelled; a cancelling one is answered as it is
CANCELLABLE = frozenset((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS))
