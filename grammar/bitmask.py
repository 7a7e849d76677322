"""Applying token bitmasks to logits on the CPU: the per-step hot path of structured output.

A bitmask row holds one bit per token (int32 words, little-endian bit order within a word, bit
set = allowed), as xgrammar fills it. Measured on real grammars, rows come in two shapes:

* sparse, between JSON tokens: 1-15 tokens allowed out of 49,152;
* dense, inside a JSON string: ~48,800 allowed, a few hundred forbidden (quotes, escapes).

xgrammar's CPU kernel writes -inf one bit at a time: about 2 us for a dense row but about 190 us
for a sparse one. Here each row takes the cheaper direction — a sparse row is filled with -inf
and only its allowed logits are written back, a dense row has only its forbidden ids set — and
the ids are found by unpacking only the words that matter, vectorised over the whole batch
(docs/benchmarks.md, "Bitmask application", has the numbers).

For greedy rows `masked_argmax` never writes the logits: a sparse row's argmax is taken over its
gathered allowed logits, a dense row's unmasked argmax is kept when its bit is set.

Other devices (CUDA) use a kernel registered by the grammar backend (`register_device_kernel`),
so this module does not import any grammar library.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

# device type -> fn(logits, bitmask aligned with the logits rows, row indices or None)
DeviceKernel = Callable[[torch.Tensor, torch.Tensor, "list[int] | None"], None]
_device_kernels: dict[str, DeviceKernel] = {}

_FULL_WORD = np.uint32(0xFFFFFFFF)


def register_device_kernel(device_type: str, kernel: DeviceKernel) -> None:
    """Use `kernel` for logits on `device_type` (e.g. "cuda") instead of the torch fallback."""
    _device_kernels[device_type] = kernel


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                  row_indices: Sequence[int] | None = None) -> None:
    """Set logits of forbidden tokens to -inf, in place, touching only the constrained rows.

    logits: [num_rows, vocab_size]. bitmask: int32 [num_bitmask_rows, >= ceil(vocab_size / 32)].
    row_indices[k] is the logits row that bitmask row k constrains (distinct; None: row k
    constrains row k). Bits past vocab_size are ignored; columns past the bitmask's width would
    be unconstrained, so a bitmask that is too narrow is an error.
    """
    rows = _check(logits, bitmask, row_indices)
    if logits.device.type != "cpu":
        _apply_on_device(logits, bitmask, rows)
        return
    words = _words(bitmask)
    sparse = _sparse_rows(words, logits.shape[1])
    with _float32_array(logits) as array:
        flat = array.reshape(-1)  # a view: _float32_array hands out a C-contiguous array
        if sparse.any():
            which = np.flatnonzero(sparse)
            flat_ids = _flat_ids(words[which], rows[which], logits.shape[1], allowed=True)
            keep = flat[flat_ids]
            array[rows[which]] = -np.inf
            flat[flat_ids] = keep
        if not sparse.all():
            which = np.flatnonzero(~sparse)
            flat[_flat_ids(words[which], rows[which], logits.shape[1], allowed=False)] = -np.inf


def masked_argmax(logits: torch.Tensor, bitmask: torch.Tensor,
                  row_indices: Sequence[int] | None = None) -> torch.Tensor:
    """For each bitmask row k, the allowed token with the highest logit in logits[row_indices[k]].

    Returns int64 [num_bitmask_rows] on the logits' device; `logits` is not modified. Ties go
    to the lowest token id, like argmax. A row that allows no token at all (a grammar bug: a
    finished grammar still allows its stop tokens) yields the unmasked argmax.
    """
    rows = _check(logits, bitmask, row_indices)
    if logits.device.type != "cpu":
        index = torch.as_tensor(rows, device=logits.device)
        masked = logits[index].clone()
        _apply_on_device(masked, bitmask, np.arange(len(rows)))
        result = masked.argmax(dim=1)
        empty = torch.from_numpy(~_words(bitmask).any(axis=1)).to(logits.device)
        return torch.where(empty, logits[index].argmax(dim=1), result)  # nothing allowed: unmasked
    words = _words(bitmask)
    vocab_size = logits.shape[1]
    out = np.empty(len(rows), dtype=np.int64)
    sparse = _sparse_rows(words, vocab_size)
    with _float32_array(logits, write_back=False) as array:
        if sparse.any():
            which = np.flatnonzero(sparse)
            out[which] = _sparse_argmax(array, words[which], rows[which])
        if not sparse.all():
            which = np.flatnonzero(~sparse)
            picked = _take_rows(array, rows[which]).argmax(axis=1)
            allowed = (words[which, picked >> 5] >> (picked & 31).astype(np.uint32)) & 1
            out[which] = picked
            if not allowed.all():  # the best token is forbidden: mask those rows and look again
                again = which[allowed == 0]
                masked = torch.from_numpy(_take_rows(array, rows[again]).copy())
                apply_bitmask(masked, bitmask[torch.from_numpy(again)])
                out[again] = masked.numpy().argmax(axis=1)
    return torch.from_numpy(out)


# -- internals --------------------------------------------------------------------------------


def _check(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: Sequence[int] | None) -> np.ndarray:
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(f"logits and bitmask must be 2-D, got {tuple(logits.shape)} and {tuple(bitmask.shape)}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError(f"bitmask covers {bitmask.shape[1] * 32} tokens, logits have {logits.shape[1]}")
    if row_indices is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {logits.shape[0]}; pass row_indices")
        return np.arange(logits.shape[0])
    rows = np.asarray(row_indices, dtype=np.int64).reshape(-1)
    if len(rows) != bitmask.shape[0]:
        raise ValueError(f"{len(rows)} row_indices for {bitmask.shape[0]} bitmask rows")
    if len(rows) and (rows.min() < 0 or rows.max() >= logits.shape[0]):
        raise ValueError(f"row_indices out of range for {logits.shape[0]} logits rows")
    return rows


def _words(bitmask: torch.Tensor) -> np.ndarray:
    return bitmask.cpu().contiguous().numpy().view(np.uint32)


def _sparse_rows(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """True for rows where fewer than half the tokens are allowed (cheaper to write back)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        num_allowed = np.bitwise_count(words).sum(axis=1, dtype=np.int64)
    else:
        num_allowed = np.unpackbits(words.view(np.uint8), axis=1).sum(axis=1, dtype=np.int64)
    return num_allowed * 2 < vocab_size


def _flat_ids(words: np.ndarray, rows: np.ndarray, vocab_size: int, *, allowed: bool) -> np.ndarray:
    """Flat indices (row * vocab_size + token) of the allowed (or forbidden) tokens of `rows`.

    Only words that contain such a bit are unpacked: non-zero words for allowed tokens,
    not-all-ones words for forbidden ones.
    """
    num_words = words.shape[1]
    flat_words = words.reshape(-1)
    word_ids = np.flatnonzero(flat_words if allowed else flat_words != _FULL_WORD)
    bits = np.unpackbits(flat_words[word_ids].view(np.uint8), bitorder="little")
    hits = np.flatnonzero(bits if allowed else bits == 0)
    word_ids = word_ids[hits >> 5]
    token_ids = (word_ids % num_words) * 32 + (hits & 31)
    in_vocab = token_ids < vocab_size  # the last word's spare bits, padding columns of the bitmask
    return rows[word_ids[in_vocab] // num_words] * vocab_size + token_ids[in_vocab]


def _sparse_argmax(array: np.ndarray, words: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Segmented argmax over the gathered allowed logits of each row."""
    vocab_size = array.shape[1]
    local_ids = _flat_ids(words, np.arange(len(rows)), vocab_size, allowed=True)
    segment = local_ids // vocab_size  # row-major: the ids come out row by row
    token_ids = local_ids % vocab_size
    counts = np.bincount(segment, minlength=len(rows))
    values = array.reshape(-1)[rows[segment] * vocab_size + token_ids]
    out = np.empty(len(rows), dtype=np.int64)
    empty = counts == 0
    if empty.any():  # nothing allowed: fall back to the unmasked argmax
        out[empty] = _take_rows(array, rows[empty]).argmax(axis=1)
    if not empty.all():
        starts = (np.cumsum(counts) - counts)[~empty]
        best = np.maximum.reduceat(values, starts)
        owner = np.repeat(np.arange(len(starts)), counts[~empty])
        position = np.where(values == best[owner], np.arange(len(values)), len(values))
        out[~empty] = token_ids[np.minimum.reduceat(position, starts)]
    return out


def _take_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """array[rows], as a view when the rows are consecutive (the common all-rows case)."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and np.all(np.diff(rows) == 1):
        return array[rows[0]: rows[-1] + 1]
    return array[rows]


class _float32_array:
    """A C-contiguous float32 numpy array over the logits (CPU).

    numpy rather than torch: on this CPU numpy's argmax is ~13x and its row fill ~4x faster
    than torch's single-threaded kernels (measured). float32 contiguous logits are used in
    place; other dtypes or layouts work on a float32 copy that is written back on exit.
    """

    def __init__(self, logits: torch.Tensor, *, write_back: bool = True) -> None:
        self._logits = logits
        self._direct = logits.dtype == torch.float32 and logits.is_contiguous()
        self._work = logits if self._direct else logits.float().contiguous()
        self._write_back = write_back

    def __enter__(self) -> np.ndarray:
        return self._work.numpy()

    def __exit__(self, *exc: object) -> None:
        if not self._direct and self._write_back:
            self._logits.copy_(self._work)


def _apply_on_device(logits: torch.Tensor, bitmask: torch.Tensor, rows: np.ndarray) -> None:
    kernel = _device_kernels.get(logits.device.type)
    # the device kernels take a bitmask aligned with the logits rows
    aligned = bitmask.new_full((logits.shape[0], bitmask.shape[1]), -1)
    aligned[torch.from_numpy(rows)] = bitmask.cpu()
    aligned = aligned.to(logits.device, non_blocking=True)
    if kernel is not None:
        kernel(logits, aligned, rows.tolist())
        return
    # torch fallback for devices without a kernel: unpack bits on the device
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((aligned[rows].unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, : logits.shape[1]]
    index = torch.as_tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
