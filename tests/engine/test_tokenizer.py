"""Tokenizer and chat template: identical to transformers' rendering and ids (transformers only here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.frontend.tokenizer import Tokenizer, validate_messages

REPO_ROOT = Path(__file__).resolve().parents[2]

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "with_system": [
        {"role": "system", "content": "You answer in JSON."},
        {"role": "user", "content": "Give me a person."},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Count to three.\n  Indented line\twith tab"},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français 🇫🇷"},
        {"role": "user", "content": "你好，世界！ naïve café — “quotes” & <tags>"},
    ],
    "special_text_in_content": [{"role": "user", "content": "say <|im_end|> then {{ not jinja }}"}],
    "extra_keys": [{"role": "user", "content": "hi", "name": "bob", "tool_calls": None}],
}


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_model_dir(model_dir)


@pytest.fixture(scope="module")
def hf(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def hf_chat_ids(hf_tokenizer, messages, **kwargs) -> list[int]:
    out = hf_tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids = tok.encode_chat(messages, add_generation_prompt=add_generation_prompt)
    assert ids == hf_chat_ids(hf, messages, add_generation_prompt=add_generation_prompt)


def test_default_system_prompt_only_without_system_message(tok):
    default = "You are a helpful AI assistant named SmolLM"
    assert default in tok.apply_chat_template(CONVERSATIONS["user_only"])
    with_system = tok.apply_chat_template(CONVERSATIONS["with_system"])
    assert default not in with_system
    assert with_system.startswith("<|im_start|>system\nYou answer in JSON.<|im_end|>\n")
    assert with_system.endswith("<|im_start|>assistant\n")


TEXTS = ["", "Hello world", "  leading spaces and trailing  ", "line1\nline2\r\n\ttab",
         "你好，世界 🎉 naïve", "<|im_start|>user\nhi<|im_end|>", "{\"a\": [1, 2.5e-3, null]}"]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf, text):
    for add_special_tokens in (True, False):
        ids = tok.encode(text, add_special_tokens=add_special_tokens)
        assert ids == hf.encode(text, add_special_tokens=add_special_tokens)
    ids = tok.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


def test_special_ids_and_vocab(tok, hf):
    assert tok.eos_token_id == hf.eos_token_id == 2
    assert tok.bos_token_id == hf.bos_token_id == 1
    assert tok.pad_token_id == hf.pad_token_id
    assert tok.eos_token_ids == (2,)
    assert tok.vocab_size == len(hf) == 49152
    assert tok.special_token_ids == frozenset(hf.all_special_ids) | {
        i for i, t in hf.added_tokens_decoder.items() if t.special}
    # SmolLM2's config adds no bos: the template writes <|im_start|> itself
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)


@pytest.fixture(scope="module")
def bos_dir(model_dir, tmp_path_factory) -> Path:
    """The default tokenizer whose tokenizer.json adds a bos, a config that says otherwise (and asks
    for an eos), and two stop ids."""
    folder = tmp_path_factory.mktemp("bos")
    tokenizer_json = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer_json["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(add_bos_token=False, add_eos_token=True, bos_token="<|endoftext|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5, 2]}))
    (folder / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    return folder


def test_bos_from_tokenizer_json_as_transformers(bos_dir):
    """transformers 5 lets tokenizer.json's post-processor decide and ignores add_bos/eos_token."""
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(bos_dir))
    ours = Tokenizer.from_model_dir(bos_dir)
    for text in ("Hello world", ""):
        assert ours.encode(text) == hf_tok.encode(text)
        assert ours.encode(text, add_special_tokens=False) == hf_tok.encode(text, add_special_tokens=False)
    assert ours.encode("x")[0] == ours.bos_token_id == 0
    assert ours.eos_token_ids == (2, 5)
    messages = [{"role": "user", "content": "hi"}]
    # the template writes the bos; encoding the prompt must not add a second one
    expected = [0] + ours.encode("hi", add_special_tokens=False)
    assert ours.encode_chat(messages) == hf_chat_ids(hf_tok, messages, add_generation_prompt=True) == expected


FEATURE_TEMPLATE = """\
{%- if messages[0].role == 'tool' %}{{ raise_exception('no tools first') }}{% endif %}
{{ bos_token }}
{% for m in messages %}
    {% if m.role == 'skip' %}{% continue %}{% endif %}
    {% generation %}[{{ m.role | upper }}] {{ m | tojson }}{% endgeneration %}
{% endfor %}
{{ {'ü': [1, 2], 'b': 'x'} | tojson(indent=2) }}
{{ eos_token }}{% if add_generation_prompt %}<go>{% endif %}{{ extra_var | default('none') }}
"""


def test_template_features_match_transformers(tok, hf):
    custom = Tokenizer(tok.backend, tok.special_tokens, chat_template=FEATURE_TEMPLATE)
    messages = [{"role": "user", "content": "é \"q\" <b>"}, {"role": "skip", "content": "x"},
                {"role": "assistant", "content": "ok"}]
    for kwargs in ({}, {"extra_var": 7}):
        ours = custom.apply_chat_template(messages, **kwargs)
        theirs = hf.apply_chat_template(messages, chat_template=FEATURE_TEMPLATE, tokenize=False,
                                        add_generation_prompt=True, **kwargs)
        assert ours == theirs
    with pytest.raises(ValueError, match="no tools first"):
        custom.apply_chat_template([{"role": "tool", "content": "x"}])


def test_template_cannot_escape_sandbox(tok):
    evil = Tokenizer(tok.backend, tok.special_tokens,
                     chat_template="{{ messages.__class__.__mro__ }}{{ messages.append(1) }}")
    with pytest.raises(ValueError, match="chat template"):
        evil.apply_chat_template([{"role": "user", "content": "x"}])


def test_no_chat_template(tok):
    plain = Tokenizer(tok.backend, tok.special_tokens)
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("messages, match", [
    ("hello", "must be a list"),
    ([], "at least one"),
    (["hi"], r"messages\[0\] must be a dict"),
    ([{"content": "x"}], r"messages\[0\].role must be a string, got missing"),
    ([{"role": "user", "content": "x"}, {"role": 3, "content": "x"}],
     r"messages\[1\].role must be a string, got a int"),
    ([{"role": "user", "content": ["part"]}], r"messages\[0\].content must be a string, got a list"),
    ([{"role": "user", "content": None}], r"content must be a string, got missing"),
    ([{"role": "", "content": "x"}], "must not be empty"),
])
def test_message_validation(tok, messages, match):
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template(messages)


def test_validate_messages_copies():
    messages = [{"role": "user", "content": "x", "name": None}]
    chat = validate_messages(messages)
    assert chat == [{"role": "user", "content": "x"}]
    assert messages[0] == {"role": "user", "content": "x", "name": None}


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_model_dir(tmp_path)


def test_front_end_modules_do_not_import_torch():
    code = ("import sys, engine.frontend.tokenizer, engine.frontend.detokenizer, engine.frontend.output_processor; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, check=True)
