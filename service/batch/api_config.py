"""The server's Batches API settings: where files and batches live, what it accepts, how hard batches run."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# the engine's priority for a batch's lines: interactive requests default to 0 and a lower value
# is served first, so under load the engine schedules them ahead of batch lines
BATCH_PRIORITY = 10
COMPLETION_WINDOW_S = {"24h": 24 * 3600}  # the completion windows OpenAI's API accepts


def default_data_dir() -> Path:
    """$FORMWORK_CACHE/data, else ~/.cache/formwork/data (beside the model and kernel caches)."""
    return Path(os.environ.get("FORMWORK_CACHE") or Path.home() / ".cache" / "formwork") / "data"


@dataclass(frozen=True)
class BatchApiConfig:
    data_dir: Path  # the store (service/batch/store.py); created on start
    max_file_bytes: int = 200 << 20  # an uploaded file (OpenAI's limit for batch input files)
    max_requests: int = 50_000  # lines in one batch's input (OpenAI's limit)
    max_concurrent_lines: int = 4  # a running batch's lines in the engine at once
    priority: int = BATCH_PRIORITY
    # False for the default data directory: when another server on this machine holds it, this one
    # serves without the Files and Batches APIs instead of refusing to start
    required: bool = True

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_requests", "max_concurrent_lines"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.priority <= 0:
            raise ValueError(f"the batch priority must be > 0 (interactive requests have 0), got {self.priority}")
