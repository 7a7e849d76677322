"""The checks every request passes, whichever front end it came through, and the engine structs
they produce (SamplingParams, Constraint). Every error names the request field (service/request.py).
"""
from __future__ import annotations

import math
from typing import Any

from engine.sampling_params import SamplingParams
from grammar.chat.structural_tag import StructuralTagError
from grammar.constraint import Constraint
from service.errors import invalid_argument
from service.limits import ServiceLimits
from service.request import (CONSTRAINT_FIELD_KINDS, FLOAT_FIELDS, ConstraintRequest, GenerationRequest, PromptInput,
                             SamplingRequest)

# SamplingRequest fields that are None when unset, named as in SamplingParams
_OPTIONAL_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                             "frequency_penalty", "presence_penalty", "ignore_eos", "include_stop_str_in_output",
                             "logprobs", "speculative", "min_tokens")
# SamplingParams field names, longest first: its ValueErrors start with the field they are about
_SAMPLING_FIELDS_LONGEST_FIRST = sorted(SamplingParams.__struct_fields__, key=len, reverse=True)
_CONSTRAINT_OPTIONS = ("strict", "any_whitespace", "jump_forward", "close_early", "whitespace", "grammar_syntax")


def check_prompt(prompt: PromptInput, vocab_size: int) -> PromptInput:
    """`prompt`, if it is not empty and its token ids are the model's."""
    if prompt.text is not None and not prompt.text:
        raise invalid_argument("prompt", "must not be empty")
    if prompt.messages is not None:
        if not prompt.messages:
            raise invalid_argument("chat.messages", "must hold at least one message")
        for index, message in enumerate(prompt.messages):
            if not message["role"]:
                raise invalid_argument(f"chat.messages[{index}].role", "must not be empty")
    if prompt.token_ids is not None:
        if not prompt.token_ids:
            raise invalid_argument("prompt_token_ids.ids", "must hold at least one token id")
        bad = [t for t in prompt.token_ids if t >= vocab_size]
        if bad:
            raise invalid_argument("prompt_token_ids.ids", f"ids must be in [0, {vocab_size}); got {bad[:5]}")
    return prompt


def sampling_params(request: GenerationRequest, limits: ServiceLimits, vocab_size: int) -> SamplingParams:
    """SamplingParams of a request: its set fields over the engine's defaults, validated."""
    sampling: SamplingRequest = request.sampling
    kwargs: dict[str, Any] = {name: getattr(sampling, name) for name in _OPTIONAL_SAMPLING_FIELDS
                              if getattr(sampling, name) is not None}
    for name in FLOAT_FIELDS:
        if name in kwargs and not math.isfinite(kwargs[name]):
            raise invalid_argument(name, f"must be a finite number, got {kwargs[name]}")
    max_tokens = sampling.max_tokens if sampling.max_tokens is not None else limits.default_max_tokens
    if max_tokens < 1:
        raise invalid_argument("max_tokens", f"must be >= 1, got {max_tokens}")
    if max_tokens > limits.max_tokens_cap:
        raise invalid_argument("max_tokens", f"{max_tokens} exceeds this server's max_tokens_cap of "
                                             f"{limits.max_tokens_cap}")
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        kwargs["stop_token_ids"] = list(sampling.stop_token_ids)
    if request.constraint is not None:
        kwargs["constraint"] = engine_constraint(request.constraint, limits)
    params = SamplingParams(max_tokens=max_tokens, **kwargs)
    try:
        params.validate(vocab_size)
    except ValueError as e:
        message = str(e)
        field = next((f for f in _SAMPLING_FIELDS_LONGEST_FIRST if message.startswith(f)), "sampling")
        raise invalid_argument(field, message[len(field):].lstrip() if field != "sampling" else message) from None
    return params


def engine_constraint(constraint: ConstraintRequest, limits: ServiceLimits) -> Constraint:
    """The engine Constraint, size-checked and validated (JSON syntax, non-empty spec, choices);
    whether it compiles is the grammar compiler's call."""
    kind = constraint.kind
    path = f"constraint.{kind}"
    num_bytes = len(constraint.spec.encode()) + sum(len(c.encode()) for c in constraint.choices)
    if num_bytes > limits.max_constraint_bytes:
        raise invalid_argument(path, f"is {num_bytes} bytes; this server's max_constraint_bytes is "
                                     f"{limits.max_constraint_bytes}")
    options = {name: getattr(constraint, name) for name in _CONSTRAINT_OPTIONS if getattr(constraint, name) is not None}
    if constraint.grammar_syntax is not None and kind != "grammar":
        raise invalid_argument("constraint.grammar_syntax", f"applies to a grammar constraint, not {kind}")
    result = Constraint(kind=CONSTRAINT_FIELD_KINDS[kind], spec=constraint.spec, choices=list(constraint.choices),
                        **options)
    try:
        result.validate()
    except StructuralTagError as e:  # named down to the field inside the tag
        raise invalid_argument(path if e.path == "structural_tag" else f"{path}.{e.path}", e.problem) from None
    except ValueError as e:
        raise invalid_argument(path, str(e)) from None
    return result
