"""What the service accepts: explicit, configurable limits (the engine's own live in EngineConfig)."""
from __future__ import annotations

from dataclasses import dataclass

from grammar.chat.tool_calls import SYNTAXES

MAX_LOGPROBS = 20  # the engine's bound (SamplingParams.validate)


@dataclass(frozen=True)
class ServiceLimits:
    """Limits checked at the edge, before a request reaches the engine.

    The queue length is the engine's `SchedulerConfig.max_num_waiting`: the service admits at most
    `max_num_seqs + max_num_waiting` unfinished requests and answers RESOURCE_EXHAUSTED beyond.
    """

    max_message_bytes: int = 4 << 20  # one request or response message
    max_constraint_bytes: int = 256 << 10  # a schema, regex or grammar (text), or all choices together
    max_tokens_cap: int = 4096  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # max_tokens when a request leaves it unset
    max_request_id_len: int = 256  # characters
    shutdown_grace_s: float = 30.0  # SIGTERM: in-flight requests get this long to finish
    # SIGTERM: before that, health says NOT_SERVING this long while calls are still taken, so a
    # load balancer's health check sees it and stops sending before the server refuses calls
    drain_delay_s: float = 0.0
    # the model's chat format, over its family's defaults (service/chat_format.py)
    tool_call_syntax: str = ""  # a grammar.chat.tool_calls.SYNTAXES name; "": the family's
    think_start: str = ""  # with think_end: the model's think markers
    think_end: str = ""  # "": the family's markers, if any
    no_reasoning: bool = False  # treat the model as one that does not think

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_constraint_bytes", "max_tokens_cap", "default_max_tokens",
                     "max_request_id_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(f"default_max_tokens ({self.default_max_tokens}) must not exceed max_tokens_cap "
                             f"({self.max_tokens_cap})")
        if self.tool_call_syntax and self.tool_call_syntax not in SYNTAXES:
            raise ValueError(f"unknown tool call syntax {self.tool_call_syntax!r}; expected one of "
                             f"{', '.join(SYNTAXES)}")
        if self.think_start and not self.think_end:
            raise ValueError("think_start needs think_end")
        for name in ("shutdown_grace_s", "drain_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
