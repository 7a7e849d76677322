"""Request fields the HTTP API does not declare: ignored where that is safe, else refused by name.

A client that sends a field believes it has an effect; a field dropped without a word is an answer
the client misreads (free text where it asked for a constrained one). So an undeclared field is
ignored only when OpenAI documents it as one a server may leave unhonoured, or when it is a peer's
(vLLM's, SGLang's) at the value Formwork's behaviour already has; any other is a 400 naming it.
docs/http.md lists the ignored fields and why each is safe.
"""
from __future__ import annotations

from typing import Any

from service.errors import invalid_argument

# OpenAI's optional fields that change nothing in the answer: who asked (user, safety_identifier),
# bookkeeping (metadata, store: nothing is stored here), routing and caching hints (service_tier,
# prompt_cache_key, prompt_cache_retention), and a latency hint (prediction: predicted output)
IGNORED = frozenset(("user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                     "safety_identifier", "prediction"))

# peers' fields honoured only at the value Formwork always has: field -> that value
FIXED = {
    "skip_special_tokens": True,  # special tokens are left out of the text
    "spaces_between_special_tokens": True,
    "separate_reasoning": True,  # SGLang: the think section comes apart, as reasoning_content
    "stream_reasoning": True,  # SGLang: streamed as it comes
    "use_beam_search": False,
    # vLLM's server-wide backend name, any value: Formwork's per-request choice is formwork.grammar_backend
    "guided_decoding_backend": None,
}

# words in a field's name that say it asks for an output shape: refused with a pointer to the fields
# that do (a constraint that is silently dropped is the worst kind of ignored field)
_CONSTRAINT_WORDS = ("regex", "grammar", "ebnf", "lark", "schema", "guided", "structur", "choice", "json",
                     "constraint", "pattern", "format", "tag")
CONSTRAINT_FIELDS = "response_format, structured_outputs, guided_json/regex/choice/grammar, regex, ebnf or json_schema"


def check_extra_fields(extra: dict[str, Any] | None, where: str = "", constraint_fields: str = CONSTRAINT_FIELDS
                       ) -> None:
    """Raise ServiceError (INVALID_ARGUMENT) naming the first undeclared field that is neither
    ignorable nor at its fixed value; `where` prefixes the field's path (a nested object's),
    `constraint_fields` are the fields that do constrain the output, for the message."""
    for name, value in (extra or {}).items():
        path = f"{where}{name}"
        if name in IGNORED:
            continue
        if name in FIXED:
            fixed = FIXED[name]
            if fixed is None or value == fixed or value is None:
                continue
            raise invalid_argument(path, f"only {fixed!r} is supported (Formwork always behaves so)")
        if any(word in name.lower() for word in _CONSTRAINT_WORDS):
            raise invalid_argument(path, f"is not an output constraint Formwork reads here; constrain the output "
                                         f"with {constraint_fields} (docs/http.md)")
        raise invalid_argument(path, "is not supported by this server (docs/http.md lists the fields it reads "
                                     "and the ones it ignores)")
