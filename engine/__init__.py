"""Formwork's engine. `from engine import LLM, SamplingParams` for offline use."""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import limit_torch_to_cpu_isa

limit_torch_to_cpu_isa()  # first: before anything below imports torch

from engine.sampling_params import SamplingParams  # noqa: E402
from grammar.constraint import Constraint

if TYPE_CHECKING:
    from engine.llm import LLM

__all__ = ["LLM", "SamplingParams", "Constraint"]


def __getattr__(name: str):
    if name == "LLM":  # lazily: importing the engine package must not pull in torch (the service imports it)
        from engine.llm import LLM
        return LLM
    raise AttributeError(name)
