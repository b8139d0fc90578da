"""What a batch says about its rows: padding, and documents packed into one row.

A registry keyed by the forward's argument name, as Hugging Face models name them: each reader
turns that argument's values into each row's documents' lengths. Reading values syncs a CUDA
device (``tolist``); a batch with none of these arguments is read from its shapes alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InputError

#: Argument name -> (the argument's value, the executed sequence length) -> each row's
#: documents' lengths, or None when the argument says nothing beyond the shapes.
ROW_READERS: dict[str, Callable[[Any, int], list[list[int]] | None]] = {}


def row_reader(*names: str):
    def register(function):
        for name in names:
            ROW_READERS[name] = function
        return function
    return register


@row_reader("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q")
def cumulative_lengths(value: Any, seq: int) -> list[list[int]]:
    """Flash attention's varlen layout: one packed row, documents between the offsets."""
    offsets = [int(v) for v in value.reshape(-1).tolist()]
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise InputError(f"cumulative sequence lengths must start at 0 and never decrease, "
                         f"got {offsets[:8]}{'...' if len(offsets) > 8 else ''}")
    return [[b - a for a, b in zip(offsets, offsets[1:]) if b > a]]


@row_reader("position_ids")
def restarting_positions(value: Any, seq: int) -> list[list[int]] | None:
    """Position ids that restart at 0 inside a row mark packed documents (as transformers'
    ``DataCollatorWithFlattening`` writes them)."""
    if value.dim() != 2:
        return None
    rows = []
    for positions in value.tolist():
        starts = [i for i, p in enumerate(positions) if p == 0] or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        rows.append([b - a for a, b in zip(starts, [*starts[1:], len(positions)])])
    return rows


@row_reader("attention_mask")
def padding_mask(value: Any, seq: int) -> list[list[int]] | None:
    """A 2-D mask of 1 for tokens and 0 for padding: each row at its number of tokens."""
    if value.dim() != 2 or value.is_floating_point():
        return None
    return [[int(n)] for n in value.sum(dim=-1).tolist()]


def rows_of(arguments: dict[str, Any], batch: int, seq: int) -> list[list[int]]:
    """Each row's documents: packed documents where an argument marks them, each trimmed to
    the row's tokens where a padding mask marks them; else every row whole."""
    rows = [[seq] for _ in range(batch)]
    packed = None
    for name in ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q", "position_ids"):
        if arguments.get(name) is not None:
            packed = ROW_READERS[name](arguments[name], seq)
            if packed is not None:
                break
    if packed is not None:
        rows = packed
    mask = arguments.get("attention_mask")
    tokens = ROW_READERS["attention_mask"](mask, seq) if mask is not None else None
    if tokens is None:
        return rows
    return [_trimmed(row, count) for row, (count,) in zip(rows, tokens)]


def _trimmed(documents: list[int], tokens: int) -> list[int]:
    """A row's documents within its first ``tokens`` positions (padding follows them)."""
    kept, left = [], tokens
    for length in documents:
        if left <= 0:
            break
        kept.append(min(length, left))
        left -= kept[-1]
    return kept
