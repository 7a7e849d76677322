"""What happened to one request of a serving benchmark, as the load generator (bench/serve.py), the
HTTP client and the peers record it, and as the summaries (bench/report.py) read it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What happened to one request; times in seconds on the client's monotonic clock."""

    request_id: str
    sent_at: float
    ok: bool = False
    error: str = ""  # the status code and message of a failed RPC
    text: str = ""
    finish_reason: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_forced_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified, and of those accepted
    num_accepted_draft_tokens: int = 0
    ttft_s: float = 0.0  # send -> first message with tokens
    e2e_s: float = 0.0  # send -> last message
    # arrival of each message that carried tokens, relative to sent_at, and its token count
    token_times_s: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    # (name, arguments text) of each call as the server parsed them, `text` then being the rest of
    # the answer (an OpenAI-style chat stream); None: the calls are read from `text` itself
    tool_calls: list[tuple[str, str]] | None = None
    # the server's own timings (final message)
    server_queued_s: float = 0.0
    server_grammar_wait_s: float = 0.0
    server_ttft_s: float = 0.0
    server_total_s: float = 0.0
    forward_passes: int = 0
    grammar_backend: str = ""  # the grammar library that enforced the constraint ("": none)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive messages carrying tokens (a jump-forward run arrives as one)."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)
