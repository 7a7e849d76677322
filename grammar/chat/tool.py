"""One tool a request offers: its name, what it does, and the JSON Schema of its arguments."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: Any = None  # a JSON Schema (dict or bool); None: any JSON object

    @property
    def schema(self) -> Any:
        return {"type": "object"} if self.parameters is None else self.parameters
