from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]

class GrammarBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAMMAR_BACKEND_UNSPECIFIED: _ClassVar[GrammarBackend]
    GRAMMAR_BACKEND_AUTO: _ClassVar[GrammarBackend]
    GRAMMAR_BACKEND_XGRAMMAR: _ClassVar[GrammarBackend]
    GRAMMAR_BACKEND_LLGUIDANCE: _ClassVar[GrammarBackend]

class GrammarSyntax(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAMMAR_SYNTAX_UNSPECIFIED: _ClassVar[GrammarSyntax]
    GRAMMAR_SYNTAX_EBNF: _ClassVar[GrammarSyntax]
    GRAMMAR_SYNTAX_LARK: _ClassVar[GrammarSyntax]

class JsonWhitespace(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JSON_WHITESPACE_UNSPECIFIED: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_COMPACT: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_SPACED: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_BOUNDED: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_ANY: _ClassVar[JsonWhitespace]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
GRAMMAR_BACKEND_UNSPECIFIED: GrammarBackend
GRAMMAR_BACKEND_AUTO: GrammarBackend
GRAMMAR_BACKEND_XGRAMMAR: GrammarBackend
GRAMMAR_BACKEND_LLGUIDANCE: GrammarBackend
GRAMMAR_SYNTAX_UNSPECIFIED: GrammarSyntax
GRAMMAR_SYNTAX_EBNF: GrammarSyntax
GRAMMAR_SYNTAX_LARK: GrammarSyntax
JSON_WHITESPACE_UNSPECIFIED: JsonWhitespace
JSON_WHITESPACE_COMPACT: JsonWhitespace
JSON_WHITESPACE_SPACED: JsonWhitespace
JSON_WHITESPACE_BOUNDED: JsonWhitespace
JSON_WHITESPACE_ANY: JsonWhitespace
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "chat", "prompt_token_ids", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty", "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "logprobs", "priority", "constraint", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "speculative", "min_tokens", "grammar_backend")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    chat: Chat
    prompt_token_ids: TokenIds
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    include_stop_str_in_output: bool
    logprobs: int
    priority: int
    constraint: Constraint
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    reasoning: Reasoning
    speculative: bool
    min_tokens: int
    grammar_backend: GrammarBackend
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., include_stop_str_in_output: _Optional[bool] = ..., logprobs: _Optional[int] = ..., priority: _Optional[int] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., reasoning: _Optional[_Union[Reasoning, _Mapping]] = ..., speculative: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., grammar_backend: _Optional[_Union[GrammarBackend, str]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name", "allowed_tools")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function_name: str
    allowed_tools: AllowedTools
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function_name: _Optional[str] = ..., allowed_tools: _Optional[_Union[AllowedTools, _Mapping]] = ...) -> None: ...

class AllowedTools(_message.Message):
    __slots__ = ("mode", "function_names")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAMES_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Reasoning(_message.Message):
    __slots__ = ("enabled", "budget_tokens", "think_constraint", "constraint_in_reasoning")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    THINK_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_IN_REASONING_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    budget_tokens: int
    think_constraint: Constraint
    constraint_in_reasoning: bool
    def __init__(self, enabled: _Optional[bool] = ..., budget_tokens: _Optional[int] = ..., think_constraint: _Optional[_Union[Constraint, _Mapping]] = ..., constraint_in_reasoning: _Optional[bool] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages", "add_generation_prompt")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_schema_text", "json_object", "regex", "grammar", "choice", "structural_tag", "strict", "any_whitespace", "jump_forward", "whitespace", "grammar_syntax", "close_early", "grammar_backend")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    ANY_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    JUMP_FORWARD_FIELD_NUMBER: _ClassVar[int]
    WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_SYNTAX_FIELD_NUMBER: _ClassVar[int]
    CLOSE_EARLY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    json_schema: _struct_pb2.Struct
    json_schema_text: str
    json_object: JsonObject
    regex: str
    grammar: str
    choice: Choice
    structural_tag: str
    strict: bool
    any_whitespace: bool
    jump_forward: bool
    whitespace: JsonWhitespace
    grammar_syntax: GrammarSyntax
    close_early: bool
    grammar_backend: GrammarBackend
    def __init__(self, json_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., json_schema_text: _Optional[str] = ..., json_object: _Optional[_Union[JsonObject, _Mapping]] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ..., choice: _Optional[_Union[Choice, _Mapping]] = ..., structural_tag: _Optional[str] = ..., strict: _Optional[bool] = ..., any_whitespace: _Optional[bool] = ..., jump_forward: _Optional[bool] = ..., whitespace: _Optional[_Union[JsonWhitespace, str]] = ..., grammar_syntax: _Optional[_Union[GrammarSyntax, str]] = ..., close_early: _Optional[bool] = ..., grammar_backend: _Optional[_Union[GrammarBackend, str]] = ...) -> None: ...

class JsonObject(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Choice(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "stop_string", "stop_token_id", "usage", "timings", "logprobs", "not_enforced", "tool_calls", "reasoning", "content", "closed_early", "tool_call_deltas", "grammar_backend")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NOT_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_EARLY_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_DELTAS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stop_string: str
    stop_token_id: int
    usage: Usage
    timings: Timings
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    not_enforced: _containers.RepeatedScalarFieldContainer[str]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning: str
    content: str
    closed_early: str
    tool_call_deltas: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    grammar_backend: GrammarBackend
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., not_enforced: _Optional[_Iterable[str]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ..., content: _Optional[str] = ..., closed_early: _Optional[str] = ..., tool_call_deltas: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., grammar_backend: _Optional[_Union[GrammarBackend, str]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments_delta")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_DELTA_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments_delta: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_delta: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "forced_tokens", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    forced_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., forced_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queued_s", "grammar_wait_s", "time_to_first_token_s", "total_s", "forward_passes")
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    queued_s: float
    grammar_wait_s: float
    time_to_first_token_s: float
    total_s: float
    forward_passes: int
    def __init__(self, queued_s: _Optional[float] = ..., grammar_wait_s: _Optional[float] = ..., time_to_first_token_s: _Optional[float] = ..., total_s: _Optional[float] = ..., forward_passes: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class ValidateConstraintRequest(_message.Message):
    __slots__ = ("constraint",)
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    constraint: Constraint
    def __init__(self, constraint: _Optional[_Union[Constraint, _Mapping]] = ...) -> None: ...

class ValidateConstraintResponse(_message.Message):
    __slots__ = ("ok", "error", "compile_s", "cached", "not_enforced", "grammar_backend")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMPILE_S_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    NOT_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    compile_s: float
    cached: bool
    not_enforced: _containers.RepeatedScalarFieldContainer[str]
    grammar_backend: GrammarBackend
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., compile_s: _Optional[float] = ..., cached: _Optional[bool] = ..., not_enforced: _Optional[_Iterable[str]] = ..., grammar_backend: _Optional[_Union[GrammarBackend, str]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_name", "max_model_len", "vocab_size", "limits", "constraint_kinds", "load", "num_engine_restarts", "last_engine_crash", "num_quarantined_constraints", "tool_call_syntax", "reasoning_start", "reasoning_end")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_KINDS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    NUM_ENGINE_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ENGINE_CRASH_FIELD_NUMBER: _ClassVar[int]
    NUM_QUARANTINED_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_SYNTAX_FIELD_NUMBER: _ClassVar[int]
    REASONING_START_FIELD_NUMBER: _ClassVar[int]
    REASONING_END_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    max_model_len: int
    vocab_size: int
    limits: Limits
    constraint_kinds: _containers.RepeatedScalarFieldContainer[str]
    load: Load
    num_engine_restarts: int
    last_engine_crash: str
    num_quarantined_constraints: int
    tool_call_syntax: str
    reasoning_start: str
    reasoning_end: str
    def __init__(self, model_name: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., constraint_kinds: _Optional[_Iterable[str]] = ..., load: _Optional[_Union[Load, _Mapping]] = ..., num_engine_restarts: _Optional[int] = ..., last_engine_crash: _Optional[str] = ..., num_quarantined_constraints: _Optional[int] = ..., tool_call_syntax: _Optional[str] = ..., reasoning_start: _Optional[str] = ..., reasoning_end: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("default_max_tokens", "max_tokens_cap", "max_constraint_bytes", "max_message_bytes", "max_num_seqs", "max_queue_len", "kv_block_size", "max_logprobs")
    DEFAULT_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_CAP_FIELD_NUMBER: _ClassVar[int]
    MAX_CONSTRAINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_LEN_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    default_max_tokens: int
    max_tokens_cap: int
    max_constraint_bytes: int
    max_message_bytes: int
    max_num_seqs: int
    max_queue_len: int
    kv_block_size: int
    max_logprobs: int
    def __init__(self, default_max_tokens: _Optional[int] = ..., max_tokens_cap: _Optional[int] = ..., max_constraint_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., max_queue_len: _Optional[int] = ..., kv_block_size: _Optional[int] = ..., max_logprobs: _Optional[int] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_waiting_for_grammar", "num_free_kv_blocks", "num_total_kv_blocks", "num_cached_kv_blocks", "num_in_flight", "num_steps", "num_grammar_cache_hits", "num_grammar_compiles")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FOR_GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_GRAMMAR_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_GRAMMAR_COMPILES_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_waiting_for_grammar: int
    num_free_kv_blocks: int
    num_total_kv_blocks: int
    num_cached_kv_blocks: int
    num_in_flight: int
    num_steps: int
    num_grammar_cache_hits: int
    num_grammar_compiles: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_waiting_for_grammar: _Optional[int] = ..., num_free_kv_blocks: _Optional[int] = ..., num_total_kv_blocks: _Optional[int] = ..., num_cached_kv_blocks: _Optional[int] = ..., num_in_flight: _Optional[int] = ..., num_steps: _Optional[int] = ..., num_grammar_cache_hits: _Optional[int] = ..., num_grammar_compiles: _Optional[int] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("prompt", "chat", "tools", "reasoning")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    chat: Chat
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    reasoning: Reasoning
    def __init__(self, prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., reasoning: _Optional[_Union[Reasoning, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "tokens", "rendered_prompt")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RENDERED_PROMPT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    rendered_prompt: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[str]] = ..., rendered_prompt: _Optional[str] = ...) -> None: ...
