"""One tool a request offers: its name, what it does, and the JSON Schema of its arguments."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grammar.chat.structural_tag import Format

# compiles a content leaf (json_schema / regex) of a tool's arguments: (leaf, the parameter it is
# the value of, "" for the whole arguments object) -> the leaf as the backend's format
CompileLeaf = Callable[[Format, str], Format]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: Any = None  # a JSON Schema (dict or bool); None: any JSON object

    @property
    def schema(self) -> Any:
        return {"type": "object"} if self.parameters is None else self.parameters
