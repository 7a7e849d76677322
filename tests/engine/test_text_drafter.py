"""Drafting by text (engine/spec_decode/text_drafter.py) with the default model's tokenizer: a copy whose
tokens differ from the prompt's is found, the draft is whole tokens of the prompt's text, the
grammar cuts it, and a UTF-8 character split at either end of the text is never drafted half."""
from __future__ import annotations

import pytest

from engine.config import SpeculativeConfig
from engine.sampling_params import SamplingParams
from engine.sched.request import Request
from engine.spec_decode.speculator import TEXT_CONTINUED, TEXT_MATCHED, Speculator
from grammar.constraint import Constraint

PROMPT = "Text: the lease was signed by the tenant Ann Lee on 3 May 2024 in Oslo."


@pytest.fixture(scope="module")
def backend(model_dir):
    from grammar.xgrammar.backend import XGrammarBackend
    return XGrammarBackend(str(model_dir), 49152)


def encode(backend, text):
    return backend.text_encoder()(text)


def make_speculator(backend, k=8, **config):
    return Speculator(SpeculativeConfig(enabled=True, num_speculative_tokens=k, **config), backend)


def make_request(backend, prompt, output, constraint=None):
    request = Request("r", encode(backend, prompt), SamplingParams(temperature=0, max_tokens=64, constraint=constraint))
    request.append_output_token_ids(encode(backend, output) if isinstance(output, str) else output)
    return request


def text_of(backend, token_ids):
    return b"".join(backend.token_bytes[t] for t in token_ids)


def test_a_span_that_tokenizes_differently_after_a_quote_is_drafted_from_the_text(backend):
    request = make_request(backend, PROMPT, '{"tenant": "Ann')
    assert encode(backend, '"Ann')[-1] not in request.prompt_token_ids  # `Ann` here, ` Ann` there
    assert make_speculator(backend, draft_by_text=False).find_source(request, 8) is None

    source = make_speculator(backend).find_source(request, 8)
    assert source is not None and source.key == TEXT_MATCHED
    # whole tokens of the text after "Ann", the last one of the cut-off text dropped
    assert source.token_ids == encode(backend, " Lee on 3 May 2024 in Oslo.")[:len(source.token_ids)]
    assert 3 <= len(source.token_ids) <= 8
    assert PROMPT.encode().index(b"Ann") + 3 + len(text_of(backend, source.token_ids)) == source.text_ends[-1]


def test_the_start_of_a_string_value_is_looked_up_at_the_start_of_a_word(backend):
    request = make_request(backend, PROMPT, '{"city": "Os')  # too short a match for the byte lookup
    source = make_speculator(backend, draft_by_text=True).find_source(request, 4)
    assert source is not None and text_of(backend, source.token_ids).startswith(b"lo.")


def test_an_accepted_text_draft_is_continued_from_where_it_ended(backend):
    speculator = make_speculator(backend)
    request = make_request(backend, PROMPT, '{"tenant": "Ann')
    source = speculator.find_source(request, 2)
    state = speculator.draft_state(request)
    state.draft_ngram, state.draft_text_ends, state.draft_begin = source.key, source.text_ends, -1
    speculator.record(request, 2, 2)
    assert state.text_anchor == source.text_ends[1]
    request.append_output_token_ids(source.token_ids + encode(backend, " 3 May"))  # the output copies on
    following = speculator.find_source(request, 3)
    assert following.key == TEXT_CONTINUED
    assert text_of(backend, following.token_ids) == b" 20"  # digits are tokens of their own


def test_the_grammar_cuts_a_text_draft_and_is_left_as_it_was(backend):
    constraint = Constraint(kind="regex", spec="Ann Lee on [0-9]+")
    grammar = backend.make_grammar(backend.compile(constraint))
    output = encode(backend, "Ann")
    assert grammar.accept_tokens(output)
    request = make_request(backend, PROMPT, output, constraint)
    request.structured_output.grammar = grammar
    draft = make_speculator(backend).propose(request, 8, 1, stop_at_forced=False)
    assert text_of(backend, draft) == b" Lee on 3"  # " May" is not a digit
    assert grammar.accept_tokens(encode(backend, " Lee on 3"))  # rolled back to where it was


def test_a_character_split_by_the_text_bound_is_not_drafted_half(backend):
    speculator = make_speculator(backend)
    drafter = speculator.text_drafter
    data = "the café".encode()[:-1]  # ends inside "é"
    token_ids = drafter.encode_continuation(data, cut_short=False)
    assert token_ids == encode(backend, "the caf")[:-1]  # the split character is cut, and its word
    assert data.startswith(text_of(backend, token_ids))
    assert drafter.encode_continuation("é au lait".encode()[1:], cut_short=False) == []


def test_an_output_ending_inside_a_character_drafts_nothing_by_text(backend):
    prompt = "Text: the guest Zoë Kim arrives."
    lead_byte = next(i for i, b in enumerate(backend.token_bytes) if b == "ë".encode()[:1])
    request = make_request(backend, prompt, encode(backend, '{"guest": "Zo') + [lead_byte])
    drafter = make_speculator(backend).text_drafter
    prompt_text = drafter.prompt_text(request.prompt_token_ids)
    match = drafter.find(drafter.output_tail(request.all_token_ids, request.num_prompt_tokens), prompt_text)
    assert match is not None  # "Zo\xc3" occurs, and the text after it begins inside "ë"
    assert drafter.draft_at(prompt_text, match.begin, 8) == ([], [])


def test_the_prompt_text_is_joined_once_and_a_step_reads_only_the_outputs_end(backend):
    speculator = make_speculator(backend)
    drafter = speculator.text_drafter
    request = make_request(backend, PROMPT, '{"tenant": "Ann')
    first = speculator.prompt_text(request)
    assert first.data == PROMPT.encode() and speculator.prompt_text(request) is first
    assert first.byte_end(len(request.prompt_token_ids)) == len(PROMPT.encode())
    assert first.num_tokens_within(len(PROMPT.encode())) == len(request.prompt_token_ids)
    assert drafter.output_tail(request.all_token_ids, request.num_prompt_tokens) == b'{"tenant": "Ann'


def test_text_match_lengths_are_checked():
    with pytest.raises(ValueError, match="min_text_match"):
        SpeculativeConfig(min_text_match=8, max_text_match=4)
