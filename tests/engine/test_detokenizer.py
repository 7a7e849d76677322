"""Incremental detokenization against tokenizer.decode of the full ids, and stop strings."""
from __future__ import annotations

import pytest

from engine.frontend.detokenizer import IncrementalDetokenizer
from engine.frontend.tokenizer import Tokenizer

MULTI_BYTE_TEXTS = [
    "Héllo wörld, café crème brûlée à la façon",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "emoji 🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ok",
    "日本語のテキスト, Ελληνικά, Русский, עברית, हिन्दी",
    '{"名前": "田中", "city": "Zürich", "note": "✓ done"}',
]


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_model_dir(model_dir)


def ids_of(tok: Tokenizer, *pieces: str) -> list[int]:
    """Token ids of `pieces`, each encoded alone, so a test controls where tokens break."""
    return [i for piece in pieces for i in tok.encode(piece, add_special_tokens=False)]


def stream(detok: IncrementalDetokenizer, token_ids: list[int], chunk: int = 1) -> list[str]:
    deltas = []
    for start in range(0, len(token_ids), chunk):
        detok.update(token_ids[start:start + chunk])
        deltas.append(detok.get_delta())
    detok.finish()
    deltas.append(detok.get_delta())
    return deltas


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_multi_byte_text_matches_full_decode(tok, text, chunk):
    token_ids = tok.encode(text, add_special_tokens=False)
    if any(ord(c) > 0x2000 for c in text):
        assert any("\ufffd" in tok.decode([i]) for i in token_ids), "test text must split characters"
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, token_ids, chunk)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(token_ids) == text
    assert detok.output_text == text


def test_token_ending_mid_character_is_held(tok):
    token_ids = tok.encode("世界", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    deltas = []
    for token_id in token_ids:
        detok.update([token_id])
        deltas.append(detok.get_delta())
    # each character spans several byte tokens: nothing until it completes, then the whole character
    assert "".join(deltas) == "世界"
    assert [d for d in deltas if d] == ["世", "界"]
    assert deltas[0] == ""


def test_finish_releases_incomplete_bytes(tok):
    token_ids = tok.encode("ok 世", add_special_tokens=False)[:-1]  # cut inside 世
    full = tok.decode(token_ids)
    assert full.endswith("\ufffd")
    complete = full.rstrip("\ufffd")
    detok = IncrementalDetokenizer(tok)
    detok.update(token_ids)  # one update: the complete text before the cut is not held
    assert detok.get_delta() == complete
    detok.finish()
    assert detok.get_delta() == full[len(complete):]
    assert detok.output_text == full


def test_window_stays_small(tok):
    """Each step decodes a few tokens, never the whole output."""
    decoded_lengths = []

    class CountingBackend:
        def decode(self, token_ids, skip_special_tokens=True):
            decoded_lengths.append(len(token_ids))
            return tok.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)

    class CountingTokenizer:
        backend = CountingBackend()

    token_ids = tok.encode(" ".join(MULTI_BYTE_TEXTS) * 4, add_special_tokens=False)
    detok = IncrementalDetokenizer(CountingTokenizer())
    deltas = stream(detok, token_ids)
    assert "".join(deltas) == tok.decode(token_ids)
    assert len(token_ids) > 300 and max(decoded_lengths) <= 8
    assert len(decoded_lengths) <= 2 * len(token_ids) + 1


def test_special_tokens(tok):
    token_ids = ids_of(tok, "Hello", "<|im_end|>", " there", "<|im_start|>")
    assert "".join(stream(IncrementalDetokenizer(tok), token_ids)) == "Hello there"
    with_special = "".join(stream(IncrementalDetokenizer(tok, skip_special_tokens=False), token_ids))
    assert with_special == "Hello<|im_end|> there<|im_start|>" == tok.decode(token_ids)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(tok, include):
    token_ids = ids_of(tok, "The answer is 42", ".", "E", "N", "D", " trailing", " text")
    detok = IncrementalDetokenizer(tok, stop=[".END"], include_stop_str_in_output=include)
    consumed = [detok.update([t]) for t in token_ids]
    # the token completing ".END" is consumed; everything after it is ignored
    stop_at = len(ids_of(tok, "The answer is 42", ".", "E", "N", "D"))
    assert consumed == [1] * stop_at + [0] * (len(token_ids) - stop_at)
    assert detok.stop_str == ".END" and detok.finished
    expected = "The answer is 42.END" if include else "The answer is 42"
    assert detok.output_text == expected
    assert detok.get_delta() == expected


def test_stop_string_inside_a_multi_token_update(tok):
    token_ids = ids_of(tok, "a", "b", "STOP", "c", "d")
    detok = IncrementalDetokenizer(tok, stop=["STOP"])
    assert detok.update(token_ids) == 3
    assert detok.output_text == "ab"


def test_stop_string_inside_one_token(tok):
    token_ids = ids_of(tok, "x", " hello world")
    assert len(token_ids) == 3  # "x", " hello", " world"
    detok = IncrementalDetokenizer(tok, stop=["ell"])
    assert detok.update(token_ids) == 2
    assert detok.output_text == "x h"


def test_earliest_stop_string_wins(tok):
    detok = IncrementalDetokenizer(tok, stop=["world", "lo"])
    detok.update(ids_of(tok, "hello world"))
    assert detok.stop_str == "lo" and detok.output_text == "hel"


def test_multi_byte_stop_string(tok):
    detok = IncrementalDetokenizer(tok, stop=["世界"])
    detok.update(tok.encode("你好世界再见", add_special_tokens=False))
    assert detok.stop_str == "世界" and detok.output_text == "你好"


def test_hold_back_possible_stop_prefix(tok):
    detok = IncrementalDetokenizer(tok, stop=["STOP!", "xyz"])
    steps = [("abc", "abc"), (" ST", " "), ("O", ""), ("RM", "STORM"), (" x", " "), ("y", ""), (" and", "xy and")]
    for piece, expected_delta in steps:
        detok.update(ids_of(tok, piece))
        assert detok.get_delta() == expected_delta, piece
    assert detok.emitted_text == "abc STORM xy and"
    assert not detok.finished


def test_hold_back_released_at_finish(tok):
    detok = IncrementalDetokenizer(tok, stop=["</answer>"])
    detok.update(ids_of(tok, "42 </ans"))
    assert detok.get_delta() == "42 "
    detok.finish()
    assert detok.get_delta() == "</ans"
    assert detok.stop_str is None


def test_hold_back_never_exceeds_longest_stop_minus_one(tok):
    detok = IncrementalDetokenizer(tok, stop=["aaaa"])
    detok.update(ids_of(tok, "b", "a", "a", "a"))
    assert detok.get_delta() == "b"
    detok.update(ids_of(tok, "c"))
    assert detok.get_delta() == "aaac"


def test_no_stop_no_hold_back(tok):
    detok = IncrementalDetokenizer(tok)
    detok.update(ids_of(tok, "ST"))
    assert detok.get_delta() == "ST"


def test_update_after_stop_consumes_nothing(tok):
    detok = IncrementalDetokenizer(tok, stop=["b"])
    assert detok.update(ids_of(tok, "a", "b")) == 2
    assert detok.update(ids_of(tok, "c")) == 0
    assert detok.output_text == "a"


@pytest.mark.parametrize("stop", [(), ("\x00never",)])
def test_random_tokens_match_full_decode(tok, stop):
    """Arbitrary ids (invalid UTF-8 runs, special tokens) in random chunks: the text at the end is
    exactly the full decode, and every delta extends the previous text."""
    import random
    rng = random.Random(1234)
    byte_tokens = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])][:300]
    pool = byte_tokens + list(range(0, 17)) + tok.encode("plain words and 中文 🎉", add_special_tokens=False)
    for _ in range(20):
        token_ids = [rng.choice(pool) for _ in range(rng.randint(1, 40))]
        detok = IncrementalDetokenizer(tok, stop=stop)
        text = ""
        start = 0
        while start < len(token_ids):
            size = rng.randint(1, 4)
            detok.update(token_ids[start:start + size])
            start += size
            text += detok.get_delta()
            assert tok.decode(token_ids[:start], skip_special_tokens=True).startswith(text)
        detok.finish()
        text += detok.get_delta()
        assert text == detok.output_text == tok.decode(token_ids, skip_special_tokens=True)


def test_stop_strings_wait_for_min_tokens(tok):
    token_ids = ids_of(tok, "a", "STOP", "b", "STOP", "c")
    detok = IncrementalDetokenizer(tok, stop=["STOP"], min_tokens=3)
    # the first STOP is the second token, before min_tokens: it is text; the second one stops
    assert detok.update(token_ids) == 4
    assert detok.output_text == "aSTOPb" and detok.stop_str == "STOP"
