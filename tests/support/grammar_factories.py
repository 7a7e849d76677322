"""Factories shared by the grammar tests: one real backend per session, token-level helpers."""
from __future__ import annotations

import functools
import json

VOCAB_PADDING = 40  # LM head wider than the tokenizer, and not a multiple of 32


@functools.lru_cache(maxsize=None)
def make_backend(padding: int = VOCAB_PADDING):
    """The xgrammar backend on the real SmolLM2 tokenizer (49,152 ids) with `padding` extra ids."""
    from engine.model_files import resolve_model
    from grammar.xgrammar.backend import XGrammarBackend

    return XGrammarBackend(str(resolve_model(None)), 49152 + padding)


@functools.lru_cache(maxsize=None)
def make_llguidance_backend(padding: int = VOCAB_PADDING):
    """The llguidance backend on the same tokenizer and padding as make_backend."""
    from engine.model_files import resolve_model
    from grammar.llguidance.backend import LLGuidanceBackend

    return LLGuidanceBackend(str(resolve_model(None)), 49152 + padding)


def make_constraint(kind: str = "json_schema", spec: object = "", **options):
    from grammar.constraint import Constraint

    if not isinstance(spec, str):
        spec = json.dumps(spec)
    return Constraint(kind, spec, **options)


def encode(text: str) -> list[int]:
    return make_backend().tokenizer.encode(text, add_special_tokens=False)


def decode(token_ids: list[int]) -> str:
    return make_backend().tokenizer.decode(token_ids)


def accepts(compiled, text: str) -> bool:
    """Whether a fresh matcher takes `text` (as the tokenizer encodes it) and then a stop token."""
    backend = make_backend()
    grammar = backend.make_grammar(compiled)
    return grammar.accept_tokens(encode(text)) and grammar.accept_tokens([backend.stop_token_ids[0]])


def allowed_ids(grammar) -> list[int]:
    """The token ids `grammar` allows next, from its bitmask row."""
    import numpy as np

    backend = make_backend()
    bitmask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits).tolist()


def accepted_by(backend, compiled, text: str) -> bool:
    """`accepts` on either backend (both share the tokenizer, so the same token ids)."""
    grammar = backend.make_grammar(compiled)
    return grammar.accept_tokens(encode(text)) and (
        grammar.is_terminated() or grammar.accept_tokens([backend.stop_token_ids[0]]))
