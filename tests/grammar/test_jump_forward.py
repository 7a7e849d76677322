"""Jump-forward: forced text becomes the tokens the model would see, already accepted."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
from grammar_factories import allowed_ids, decode, encode, make_backend, make_constraint

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
# every value is bounded, so a random walk over allowed tokens always ends
BOUNDED = {"type": "object", "properties": {
    "color": {"enum": ["red", "green", "light blue"]},
    "size": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"},
    "kind": {"const": "widget"}},
    "required": ["color", "size", "ok", "kind"], "additionalProperties": False}


def make_grammar(schema, whitespace: str = "compact"):
    """Compact by default: its separators are forced text, which is what these tests look at."""
    backend = make_backend()
    return backend.make_grammar(backend.compile(make_constraint(spec=schema, whitespace=whitespace)))


def test_fixed_key_is_forced_up_to_the_chunk_that_may_merge():
    grammar = make_grammar(PERSON)
    forced = grammar.jump_forward_token_ids()
    # forced text is '{"name":"'; its last chunk '":"' could merge with the value, so it waits
    assert decode(forced) == '{"name'
    assert forced == encode('{"name')  # the model's own tokenization
    assert set(allowed_ids(grammar)) == set(encode('"') + encode('":') + encode('":"'))
    assert grammar.jump_forward_token_ids() == []  # '":"' is still one chunk: nothing safe


def test_forced_tokens_are_accepted_and_roll_back():
    grammar = make_grammar(PERSON)
    forced = grammar.jump_forward_token_ids()
    grammar.rollback(len(forced))
    assert grammar.jump_forward_token_ids() == forced


def test_nothing_is_forced_where_it_would_merge_with_the_previous_token():
    grammar = make_grammar(PERSON)
    assert grammar.accept_tokens(encode("{"))
    # '{' followed by the forced '"name' tokenizes as '{"' + 'name': the seam is not a boundary
    assert encode('{"name') != encode("{") + encode('"name')
    assert grammar.jump_forward_token_ids() == []
    assert grammar.accept_tokens(encode('"'))
    # after '"', 'name' starts a new chunk: safe
    assert decode(grammar.jump_forward_token_ids()) == "name"


def test_the_whole_tail_is_forced_when_the_grammar_ends_there():
    grammar = make_grammar({"const": {"a": 1, "b": [True, None]}})
    forced = grammar.jump_forward_token_ids()
    assert decode(forced) == '{"a":1,"b":[true,null]}'
    assert grammar.is_terminated()


@pytest.mark.parametrize("target", ['{"name":"Bob","age":42}', '{"name":"","age":-7}',
                                    '{"name":"say \\"hi\\" \\u00e9","age":0}'])
def test_forcing_and_choosing_valid_tokens_produces_the_document(target):
    """Drive the grammar toward `target`: force what it forces, then take the model's next token."""
    grammar = make_grammar(PERSON)
    output: list[int] = []
    for _ in range(100):
        forced = grammar.jump_forward_token_ids()
        output += forced
        assert target.startswith(decode(output))
        if grammar.is_terminated():
            break
        next_id = encode(target[len(decode(output)):])[0]
        assert next_id in allowed_ids(grammar)
        assert grammar.accept_tokens([next_id])
        output.append(next_id)
    assert grammar.is_terminated()
    assert decode(output) == target
    jsonschema.validate(json.loads(decode(output)), PERSON)


@pytest.mark.parametrize("seed", range(6))
def test_random_walks_with_jump_forward_stay_valid_and_canonical(seed):
    rng = random.Random(seed)
    backend = make_backend()
    grammar = make_grammar(BOUNDED)
    output: list[int] = []
    num_forced = 0
    for _ in range(200):
        forced = grammar.jump_forward_token_ids()
        if forced:
            # the model's tokenization of the forced text, and a token boundary at the seam
            assert encode(decode(forced)) == forced
            if output:
                assert encode(decode(output[-1:] + forced)) == encode(decode(output[-1:])) + forced
        output += forced
        num_forced += len(forced)
        if grammar.is_terminated():
            break
        choices = [t for t in allowed_ids(grammar) if t not in backend.stop_token_ids]
        token_id = rng.choice(choices)
        assert grammar.accept_tokens([token_id])
        output.append(token_id)
    assert grammar.is_terminated()
    document = json.loads(decode(output))
    jsonschema.validate(document, BOUNDED)
    assert num_forced >= 4  # '{"color', 'kind', 'widget"}'... forcing really happened
    # the same tokens, replayed through a fresh matcher, are accepted: forcing left no gaps
    replay = make_grammar(BOUNDED)
    assert replay.accept_tokens(output) and replay.is_terminated()


def forced_text_tokenizer(enabled: bool = True):
    from grammar.runtime.jump_forward import ForcedTextTokenizer
    return ForcedTextTokenizer(make_backend().tokenizer, enabled=enabled)


def test_nothing_is_forced_after_a_token_that_ends_inside_a_utf8_character():
    # a character the tokenizer splits into byte tokens: its first token alone is half a character
    char = next(c for c in ("🦜", "𝄞", "龘", "🙂") if len(encode(c)) > 1 and "\ufffd" in decode(encode(c)[:1]))
    partial = encode(char)[:1]
    text = '","age":'
    # the seam check alone would let the text through after the partial token; the UTF-8 guard stops it
    assert encode(decode(partial) + text) == encode(decode(partial)) + encode(text)
    tokenizer = forced_text_tokenizer()
    assert tokenizer.encode_after(partial, text) == []
    assert tokenizer.encode_after(encode("x"), text) == encode(text)  # after a whole character it is forced


def test_forced_text_off_forces_nothing():
    text = '{"name'
    assert forced_text_tokenizer().encode_after([], text) == encode(text)
    assert forced_text_tokenizer().encode_after(encode("x"), text) != []
    off = forced_text_tokenizer(enabled=False)
    assert off.encode_after([], text) == [] and off.encode_after(encode("x"), text) == []


class _WrapperOnly:
    """The transformers tokenizer without its Rust object: ForcedTextTokenizer then encodes and
    decodes through the transformers wrapper."""

    def __init__(self, tokenizer) -> None:
        self.encode = tokenizer.encode
        self.decode = tokenizer.decode


FORCED_TEXTS = ['{"name":"', '","age":', "}", '":[', "],", ' "city": "', '{\n  "id": ', "null", "true}", "-0.5e10",
                "1234567890", "  ", " \t\n", "Zürich", "日本語のテキスト", "🙂 ok", "\\u00e9\\n", "<|im_end|>",
                "a  b   c", "ÅÄÖ\"}", "x" * 40]


def test_the_rust_tokenizer_gives_the_wrappers_ids_and_seam_decisions():
    from grammar.runtime.jump_forward import ForcedTextTokenizer
    tokenizer = make_backend().tokenizer
    fast, wrapper = ForcedTextTokenizer(tokenizer), ForcedTextTokenizer(_WrapperOnly(tokenizer))
    contexts = [[]] + [encode(text)[-1:] for text in FORCED_TEXTS + ["{", '"', ":", "é", "🦜"]]
    contexts.append(encode("🦜")[:1])  # a token that ends inside a UTF-8 character
    num_forced = 0
    for text in FORCED_TEXTS:
        assert fast.encode(text) == wrapper.encode(text) == encode(text)
        for context in contexts:
            ids = fast.encode_after(context, text)
            assert ids == wrapper.encode_after(context, text), (context, text)
            num_forced += bool(ids)
    assert num_forced > len(FORCED_TEXTS) * len(contexts) // 3  # most seams are boundaries: real work
    # the seam token's text and encoding are cached: asking again gives the same answers
    assert [fast.encode_after(c, '","age":') for c in contexts] == [
        wrapper.encode_after(c, '","age":') for c in contexts]
