"""The model's tokenizer and chat template, without transformers or torch.

Loaded from a local Hugging Face model folder: `tokenizer.json` through the `tokenizers` library
(its post-processor decides bos/eos insertion, as in transformers 5), special-token names from
`tokenizer_config.json`, stop ids from `generation_config.json` and `config.json`, and the chat template rendered
with jinja2 the way transformers renders it (sandboxed, trim_blocks/lstrip_blocks,
`raise_exception`, `tojson`, special-token variables), so prompts and token ids are identical to
`AutoTokenizer.apply_chat_template` / `encode`.

The front end (service process, offline `LLM`) imports this module, so it must never import torch.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _BackendTokenizer

from engine.config import model_eos_token_ids

logger = logging.getLogger(__name__)

# the named special tokens transformers passes to a chat template, by their tokenizer_config keys
_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template.

    Thread-safe for encode/decode (the `tokenizers` backend is); immutable after construction.
    """

    def __init__(
        self,
        backend: _BackendTokenizer,
        special_tokens: dict[str, str],
        chat_template: str | None = None,
        generation_eos_token_ids: Sequence[int] = (),
        model_dir: Path | None = None,
    ) -> None:
        self.backend = backend  # the raw tokenizers.Tokenizer (e.g. for building grammar vocabularies)
        self.model_dir = model_dir
        # name -> token text, e.g. "eos_token" -> "<|im_end|>"; only the tokens the config names
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        self._template: jinja2.Template | None = _compile_chat_template(chat_template) if chat_template else None

        self.bos_token = special_tokens.get("bos_token")
        self.eos_token = special_tokens.get("eos_token")
        self.pad_token = special_tokens.get("pad_token")
        self.bos_token_id = self._id_of(self.bos_token)
        self.eos_token_id = self._id_of(self.eos_token)
        self.pad_token_id = self._id_of(self.pad_token)
        if self.eos_token_id is None and generation_eos_token_ids:
            self.eos_token_id = generation_eos_token_ids[0]
        # every id that ends generation (unless ignore_eos): the eos token first, then the extra ones
        # generation_config.json lists (chat models often end turns with a second token)
        eos_ids = [] if self.eos_token_id is None else [self.eos_token_id]
        eos_ids += [i for i in generation_eos_token_ids if i not in eos_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)

        # ids of the added tokens marked special (dropped by skip_special_tokens)
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    # ---- loading ------------------------------------------------------------------------------

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """Load from a Hugging Face model folder; ValueError if it has no usable tokenizer."""
        folder = Path(path).expanduser()
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"{str(folder)!r} has no tokenizer.json; Formwork needs a fast (tokenizers) tokenizer")
        backend = _BackendTokenizer.from_file(str(tokenizer_file))
        config = _read_json(folder / "tokenizer_config.json")

        special_tokens: dict[str, str] = {}
        # legacy folders keep special tokens in special_tokens_map.json; tokenizer_config wins
        for source in (_read_json(folder / "special_tokens_map.json"), config):
            for name in _SPECIAL_TOKEN_NAMES:
                text = _token_text(source.get(name))
                if text is not None:
                    special_tokens[name] = text

        # bos/eos insertion is tokenizer.json's post-processor alone: transformers 5 drops
        # tokenizer_config's add_bos_token / add_eos_token whenever a tokenizer.json exists
        if config.get("add_bos_token") or config.get("add_eos_token"):
            logger.debug("%s: add_bos_token/add_eos_token in tokenizer_config are ignored, as transformers "
                         "does; tokenizer.json's post-processor decides", folder)

        return cls(backend, special_tokens, chat_template=_find_chat_template(folder, config),
                   generation_eos_token_ids=model_eos_token_ids(folder), model_dir=folder)

    # ---- text <-> ids -------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds what the model's post-processor adds (bos...)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `token_ids`; incomplete UTF-8 sequences decode to U+FFFD."""
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: Iterable[int]) -> list[str | None]:
        """Vocabulary strings (e.g. "Ġthe"); None for an id outside the vocabulary."""
        id_to_token = self.backend.id_to_token
        return [id_to_token(i) for i in token_ids]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included."""
        return self.backend.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    # ---- chat ---------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **template_kwargs: Any) -> str:
        """Render `messages` with the model's chat template, as transformers renders it.

        Each message is a dict with string "role" and "content" (other keys are passed through;
        keys set to None are dropped, as transformers does). `template_kwargs` become template
        variables (e.g. `enable_thinking`) and override the special-token variables.
        Raises ValueError for malformed messages, a model without a chat template, or a template
        that rejects the conversation (its `raise_exception`).
        """
        if self._template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead of messages")
        chat = validate_messages(messages)
        variables: dict[str, Any] = {**self.special_tokens, "tools": None, "documents": None, **template_kwargs}
        try:
            return self._template.render(messages=chat, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template rejected the messages: {e}") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> list[int]:
        """Prompt token ids of a conversation: the rendered template, encoded without adding special
        tokens (the template writes them), as `apply_chat_template(..., tokenize=True)` does."""
        text = self.apply_chat_template(messages, add_generation_prompt, **template_kwargs)
        return self.encode(text, add_special_tokens=False)


def validate_messages(messages: Any) -> list[dict]:
    """Check a conversation and return plain copies of its messages (None-valued keys dropped).

    ValueError names the offending message; the caller's dicts are never modified.
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts, "
                         f"got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must contain at least one message")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be a dict with 'role' and 'content', "
                             f"got {type(message).__name__}")
        for key in ("role", "content"):
            value = message.get(key)
            if not isinstance(value, str):
                found = "missing" if value is None else f"a {type(value).__name__}"
                raise ValueError(f"messages[{index}].{key} must be a string, got {found}")
        if not message["role"]:
            raise ValueError(f"messages[{index}].role must not be empty")
        chat.append({k: v for k, v in message.items() if v is not None})
    return chat


# ---- helpers --------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {str(path)!r}: {e}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as configs write it: a string, or a serialized AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _find_chat_template(folder: Path, config: dict) -> str | None:
    """chat_template.jinja if present (transformers 5 layout), else tokenizer_config's chat_template
    (a string, or a list of named templates of which "default" is used)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    return None


class _GenerationTagExtension(jinja2.ext.Extension):
    """Accept `{% generation %}...{% endgeneration %}` (used by transformers to mark assistant
    tokens for training masks) and render its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the `generation` name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # unlike jinja2's own tojson, no HTML escaping: prompts are not HTML
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_chat_template(source: str) -> jinja2.Template:
    """Chat templates are code from the model folder: run them sandboxed and immutable."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTagExtension, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the model's chat template does not parse: {e}") from None
